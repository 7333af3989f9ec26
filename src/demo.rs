//! The `demo` command: the quickstart kernel live on GPU 0 (a Perfetto trace, its
//! capture, the report and the SVG timeline), or, with no GPU, the same from a
//! capture recorded on an H200.

use std::path::{Path, PathBuf};

use tracing_gpu::capture::Capture;
use tracing_gpu::report::{SvgOptions, Timeline};

use crate::convert::write_perfetto;
use crate::{batches, print_out, read_capture, refuse_clobbering, write_output, Exit, Failure};

/// The live demo: the quickstart example's profiled kernel (its `run` writes a
/// Perfetto trace and a capture), shared with `examples/quickstart.rs`.
#[cfg(feature = "cuda")]
#[path = "../examples/quickstart.rs"]
#[allow(dead_code)] // the example's own `main`
mod quickstart;

/// The capture shipped in the repository: four profiled launches of the quickstart
/// kernel, recorded live on an H200 (132 SMs, 211,200 device events). The
/// no-GPU `demo` replays it.
const SHIPPED_CAPTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/captures/h200-quickstart.tgpu");

/// Why no live run: `None` if a GPU can be used.
#[cfg(feature = "cuda")]
pub(crate) fn no_gpu_reason() -> Option<String> {
    if let Err(e) = tracing_gpu::cuda::ensure_libraries() {
        return Some(e.to_string());
    }
    match tracing_gpu::cuda::cudarc::driver::CudaContext::device_count() {
        Ok(n) if n > 0 => None,
        Ok(_) => Some("no CUDA device".into()),
        Err(e) => Some(format!("no usable CUDA device: {e}")),
    }
}

/// Why no live run: this build has no CUDA support.
#[cfg(not(feature = "cuda"))]
pub(crate) fn no_gpu_reason() -> Option<String> {
    Some("this build has no CUDA support: build with --features cuda (or full)".into())
}

/// Prints the report of a capture and draws its first GPU's timeline into `svg`.
fn summarize(recorded: &Capture, title: &str, svg: &Path) -> Result<(), Failure> {
    let mut summary = String::new();
    for (i, device) in recorded.devices.iter().enumerate() {
        let mut timeline = Timeline::new();
        timeline.set_names(&recorded.registry);
        timeline.set_sm_count(device.info.sm_count);
        timeline.set_title(format!(
            "{title}, GPU {} ({})",
            device.info.ordinal, device.info.name
        ));
        for l in recorded
            .launches
            .iter()
            .filter(|l| l.device == device.info.ordinal)
        {
            timeline.add_buffer(&l.buffer.view());
        }
        if timeline.event_count() == 0 {
            continue;
        }
        summary.push_str(&format!("{}\n", timeline.report()));
        if i == 0 {
            // Launches sit far apart on the host's timeline: the picture shows the
            // first one alone, so its phases are wide enough to see.
            let launches: Vec<_> = recorded
                .launches
                .iter()
                .filter(|l| l.device == device.info.ordinal)
                .collect();
            let mut first = Timeline::with_svg(SvgOptions::default());
            first.set_names(&recorded.registry);
            first.set_sm_count(device.info.sm_count);
            first.set_title(format!(
                "{title}, GPU {} ({}), launch 1 of {}",
                device.info.ordinal,
                device.info.name,
                launches.len()
            ));
            first.add_buffer(&launches[0].buffer.view());
            if let Some(picture) = first.to_svg() {
                write_output(svg, picture.as_bytes())?;
            }
        }
    }
    print_out(&summary)
}

/// What the demo writes besides the trace at `out`: the capture (a live run's) and the
/// timeline, beside it.
pub(crate) fn outputs(out: &Path) -> (PathBuf, PathBuf) {
    (out.with_extension("tgpu"), out.with_extension("svg"))
}

/// Runs the profiled quickstart kernel on GPU 0: trace at `out`, capture beside it;
/// its kernels carry line info if `lineinfo`.
#[cfg(feature = "cuda")]
fn live_demo(out: &Path, lineinfo: bool) -> Result<(), Failure> {
    let (capture, svg) = outputs(out);
    refuse_clobbering(
        &[],
        &[("trace", out), ("capture", &capture), ("timeline", &svg)],
    )?;
    eprintln!("live run on GPU 0: the quickstart kernel, 8 profiled launches");
    let summary = quickstart::run(out, Some(&capture), 8, lineinfo)
        .map_err(|e| Failure::new(Exit::Run, format!("live demo failed: {e}")))?;
    let recorded = read_capture(&capture)?;
    summarize(&recorded, "live quickstart", &svg)?;
    eprintln!(
        "trace: {} ({} launches, {} device events, {} lost)\n  open https://ui.perfetto.dev and drag the file in (or: Open trace file)\ncapture: {} (replay it: tracing-gpu convert / report)\ntimeline: {} (open it in a browser)",
        out.display(),
        summary.stats.delivered,
        summary.stats.events,
        summary.stats.events_lost,
        capture.display(),
        svg.display()
    );
    Ok(())
}

#[cfg(not(feature = "cuda"))]
fn live_demo(_out: &Path, _lineinfo: bool) -> Result<(), Failure> {
    Err(Failure::new(Exit::NoGpu, "this build has no CUDA support"))
}

pub(crate) fn demo(
    out: &Path,
    replay: bool,
    capture: Option<&Path>,
    lineinfo: bool,
) -> Result<(), Failure> {
    let reason = if replay {
        Some("--replay".to_string())
    } else {
        no_gpu_reason()
    };
    let Some(reason) = reason else {
        return live_demo(out, lineinfo);
    };
    let capture = capture.unwrap_or(Path::new(SHIPPED_CAPTURE));
    let (_, svg) = outputs(out);
    refuse_clobbering(&[capture], &[("trace", out), ("timeline", &svg)])?;
    eprintln!(
        "no live run ({reason}): replaying the capture {}",
        capture.display()
    );
    if capture == Path::new(SHIPPED_CAPTURE) && !capture.exists() {
        return Err(Failure::new(
            Exit::Input,
            format!(
                "the shipped capture {SHIPPED_CAPTURE} is not in this checkout; replay another with --capture FILE \
                 (`tracing-gpu demo` on a GPU writes one beside its trace)"
            ),
        ));
    }
    let recorded = read_capture(capture)?;
    let gpus: Vec<&str> = recorded
        .devices
        .iter()
        .map(|d| d.info.name.as_str())
        .collect();
    eprintln!(
        "  recorded on {}: {} launches of {}",
        if gpus.is_empty() {
            "no GPU".to_string()
        } else {
            gpus.join(", ")
        },
        recorded.launches.len(),
        {
            let mut k: Vec<&str> = recorded
                .launches
                .iter()
                .map(|l| l.kernel.as_str())
                .collect();
            k.dedup();
            k.join(", ")
        }
    );
    let batches = batches(&recorded, capture)?;
    let stats = write_perfetto(&recorded, &batches, out)?;
    summarize(&recorded, "replayed capture", &svg)?;
    eprintln!(
        "trace: {} ({} launches, {} device events, {} host spans)\n  open https://ui.perfetto.dev and drag the file in (or: Open trace file)\ntimeline: {} (open it in a browser)",
        out.display(),
        stats.kernels,
        stats.device_events,
        stats.host_slices,
        svg.display()
    );
    Ok(())
}
