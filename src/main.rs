//! `tracing-gpu`: the command-line tool (feature `cli`).
//!
//! It uses only the library's public API: a capture file ([`Capture`]) in, a
//! Perfetto trace, OTLP spans, a report or an SVG timeline out; and, with the
//! `cuda` feature and a GPU, live runs. Every failure is a message on stderr
//! and one of the exit codes below, never a panic.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use std::sync::Arc;

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use tracing_gpu::batch::Batch;
use tracing_gpu::capture::{Capture, CaptureDevice, CaptureError, CaptureLaunch, CaptureReader};
use tracing_gpu::output::AtomicFile;
use tracing_gpu::report::{SvgOptions, Timeline, MAX_SVG_WIDTH, MIN_SVG_WIDTH};

/// SIGINT, SIGTERM and SIGHUP: the files being written are removed.
mod signals;

/// The `demo` command: live on a GPU, or the replay of a shipped capture.
mod demo;

/// The `convert` command: a capture read once, into every output at once.
mod convert;

/// What `--help` and the README list: one code per kind of failure, so that
/// scripts can tell a bad file from a missing GPU.
const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  a run failed (a CUDA or driver error during a live run)
  2  bad usage (unknown option, missing argument, no launch with the id given, an
     output that would replace the input or another output)
  3  an input file cannot be read (missing, permission)
  4  an input file is not a valid capture (wrong magic, truncated, corrupt)
  5  an output file cannot be written
  6  no GPU: no NVIDIA driver, no device, or built without the `cuda` feature
  7  OTLP export failed (collector unreachable, or built without `otlp`)
  130, 143, 129  interrupted by SIGINT, SIGTERM, SIGHUP (files being written are removed)";

#[derive(Parser, Debug)]
#[command(
    name = "tracing-gpu",
    version,
    about = "In-kernel CUDA phase traces, aligned to the host clock: Perfetto, OTLP, reports.",
    after_help = EXIT_CODES
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Writes a real trace: live on a GPU; with none, from a capture recorded on an H200.
    #[command(after_help = EXIT_CODES)]
    Demo {
        /// The trace to write.
        #[arg(
            short,
            long,
            value_name = "FILE",
            default_value = "tracing-gpu-demo.perfetto-trace"
        )]
        out: PathBuf,
        /// Replay a capture even if a GPU is present.
        #[arg(long)]
        replay: bool,
        /// The capture to replay (default: the one shipped in captures/).
        #[arg(long, value_name = "FILE")]
        capture: Option<PathBuf>,
        /// Compile the live run's kernels without line info (by default they carry it,
        /// so that Nsight Compute maps their machine code to the source).
        #[arg(long)]
        no_lineinfo: bool,
    },
    /// Measures each GPU's clock against the host's: offset, drift and error bound.
    #[command(after_help = EXIT_CODES)]
    Calibrate {
        /// Ping-pong rounds per GPU.
        #[arg(long, value_name = "N", default_value_t = 2000)]
        samples: usize,
        /// Compile the calibration kernels without line info (by default they carry it).
        #[arg(long)]
        no_lineinfo: bool,
    },
    /// Converts a capture file into a Perfetto trace, or sends it over OTLP.
    #[command(after_help = EXIT_CODES)]
    #[command(group(clap::ArgGroup::new("to").required(true).multiple(true).args(["out", "otlp"])))]
    Convert {
        /// The capture file (.tgpu).
        capture: PathBuf,
        /// The Perfetto trace to write (open it at https://ui.perfetto.dev).
        #[arg(short, long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Send the host spans and device phases to this OTLP endpoint instead
        /// (or as well), such as http://localhost:4318 (needs the `otlp` feature).
        #[arg(long, value_name = "ENDPOINT")]
        otlp: Option<String>,
        /// OTLP transport: grpc or http/protobuf.
        #[arg(
            long,
            value_name = "PROTOCOL",
            default_value = "http/protobuf",
            requires = "otlp"
        )]
        otlp_protocol: String,
        /// How long the collector may take to answer one export, in seconds
        /// (the exporter's retries included): a collector that is silent or
        /// slow that long fails the export (exit 7).
        #[arg(
            long,
            value_name = "SECS",
            default_value = "10",
            value_parser = parse_secs,
            requires = "otlp"
        )]
        otlp_timeout: std::time::Duration,
        /// The most the whole OTLP export may take, in seconds, however well
        /// the collector answers (reading the capture counts too); past it
        /// the export fails (exit 7). A collector that answers part of an
        /// export with a rejection (`partial_success`) fails it as well.
        #[arg(
            long,
            value_name = "SECS",
            default_value = "600",
            value_parser = parse_secs,
            requires = "otlp"
        )]
        otlp_deadline: std::time::Duration,
        /// How much of each launch becomes OTLP spans: `kernel` (one span a
        /// launch, with per-type summaries), `phase` (also one span per event
        /// type and warp role) or `warp` (also every event, under one span per
        /// warp: large).
        #[arg(long, value_enum, default_value_t = OtlpDetail::Phase, requires = "otlp")]
        detail: OtlpDetail,
    },
    /// Statistics per event type and per SM, and an SVG timeline of SMs against time.
    #[command(after_help = EXIT_CODES)]
    Report {
        /// The capture file (.tgpu).
        capture: PathBuf,
        /// Also draw the timeline into this SVG file (opens in any browser). With
        /// several GPUs, GPU n's goes to FILE with `.gpu<n>` before the extension.
        /// Of several launches it draws the one with the most events, unless
        /// --launch says otherwise. The watchdog's snapshots of launches that ran
        /// past their deadline, if the capture keeps them, go to FILE with
        /// `.watchdog` before the extension: SMs against their current phases.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
        /// Only the launch with this launch id (the `gpu.launch_id` of the
        /// traces, from 1, unique in a capture), or `all`: every launch, the
        /// SVG's on one time axis. Default: the text covers every launch.
        #[arg(long, value_name = "ID|all", value_parser = parse_launch)]
        launch: Option<LaunchPick>,
        /// Width of the SVG's plot area in pixels (100 to 20000).
        #[arg(long, value_name = "PX", default_value_t = 1600,
              value_parser = clap::value_parser!(u32)
                  .range(i64::from(MIN_SVG_WIDTH)..=i64::from(MAX_SVG_WIDTH)))]
        width: u32,
    },
}

/// Exit codes, as [`EXIT_CODES`] lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    // Only live runs (feature `cuda`) fail this way.
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    Run = 1,
    NoGpu = 6,
    Export = 7,
    Usage = 2,
    Input = 3,
    BadCapture = 4,
    Output = 5,
}

/// A failure: what to print and how to exit.
#[derive(Debug)]
struct Failure {
    exit: Exit,
    message: String,
}

impl Failure {
    fn new(exit: Exit, message: impl Into<String>) -> Self {
        Failure {
            exit,
            message: message.into(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

/// Sorts what can go wrong reading a capture into "cannot read", "not a
/// capture" and "cannot be replayed" (no usable calibration).
fn capture_failure(path: &Path, e: CaptureError) -> Failure {
    match e {
        CaptureError::File { source, .. } | CaptureError::Io(source) => Failure::new(
            Exit::Input,
            format!("cannot read {}: {source}", path.display()),
        ),
        e @ (CaptureError::Clock { .. } | CaptureError::NoCalibration { .. }) => Failure::new(
            Exit::BadCapture,
            format!("{} cannot be replayed: {e}", path.display()),
        ),
        other => Failure::new(
            Exit::BadCapture,
            format!(
                "{} is not a valid tracing-gpu capture: {other}",
                path.display()
            ),
        ),
    }
}

/// Reads a whole capture.
fn read_capture(path: &Path) -> Result<Capture, Failure> {
    Capture::read(path).map_err(|e| capture_failure(path, e))
}

/// Writes a whole output file (complete or absent), or says which and why not.
fn write_output(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    let write = || -> io::Result<()> {
        let mut file = AtomicFile::create(path)?;
        file.write_all(bytes)?;
        file.commit().map(drop)
    };
    write().map_err(|e| {
        Failure::new(
            Exit::Output,
            format!("cannot write {}: {e}", path.display()),
        )
    })
}

/// The directory entry a file written at `path` replaces: its folder resolved, its own
/// name not (an output replaces a symbolic link, never its target: `AtomicFile`).
fn entry(path: &Path) -> PathBuf {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match (path.file_name(), std::fs::canonicalize(folder)) {
        (Some(name), Ok(folder)) => folder.join(name),
        _ => path.to_path_buf(),
    }
}

/// Refuses, before anything is read or written, a command whose outputs (named, what
/// each is) would replace one of its inputs or each other: `convert X -o X` would
/// replace the capture it reads, `demo -o t.svg` write its trace and then its picture
/// over it. An input is the file it resolves to (a link followed), an output the entry
/// its rename replaces.
fn refuse_clobbering(inputs: &[&Path], outputs: &[(&str, &Path)]) -> Result<(), Failure> {
    let clash = |what: String| Failure::new(Exit::Usage, what);
    for (i, (what, out)) in outputs.iter().enumerate() {
        let replaced = entry(out);
        for input in inputs {
            if std::fs::canonicalize(input).is_ok_and(|read| read == replaced) {
                return Err(clash(format!(
                    "the {what} {} is the input {}: writing it would replace what is read; choose another path",
                    out.display(),
                    input.display()
                )));
            }
        }
        if let Some((other, _)) = outputs[..i].iter().find(|(_, o)| entry(o) == replaced) {
            return Err(clash(format!(
                "the {other} and the {what} would both be written to {}; choose another path for one",
                out.display()
            )));
        }
    }
    Ok(())
}

/// One batch per launch ([`Capture::batches`]: each device's calibration refitted
/// from the stored samples); a capture that cannot be replayed is a bad capture.
fn batches(recorded: &Capture, path: &Path) -> Result<Vec<Arc<Batch>>, Failure> {
    recorded.batches().map_err(|e| {
        Failure::new(
            Exit::BadCapture,
            format!("{} cannot be replayed: {e}", path.display()),
        )
    })
}

/// A progress bar on stderr; indicatif hides it when stderr is not a terminal.
fn progress(len: usize, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} launches, {elapsed}")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(what.to_string());
    bar
}

/// `convert --detail`: `tracing_gpu::otlp::Detail`, which this build may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum OtlpDetail {
    Kernel,
    Phase,
    Warp,
}

/// `report --launch`: one launch, by its launch id, or every launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LaunchPick {
    Id(u64),
    All,
}

fn parse_launch(s: &str) -> Result<LaunchPick, String> {
    match s.trim() {
        "all" => Ok(LaunchPick::All),
        id => id
            .parse()
            .map(LaunchPick::Id)
            .map_err(|_| format!("{s:?} is neither a launch id (a whole number) nor `all`")),
    }
}

/// `--otlp-timeout`: a positive number of seconds, at most a day.
fn parse_secs(s: &str) -> Result<std::time::Duration, String> {
    match s.trim().parse::<f64>() {
        Ok(secs) if secs > 0.0 && secs <= 86_400.0 => Ok(std::time::Duration::from_secs_f64(secs)),
        _ => Err(format!(
            "{s:?} is not a number of seconds between 0 and 86400"
        )),
    }
}

/// Calibrates every GPU with `samples` ping-pong rounds and prints its device →
/// host clock map; the calibration kernels carry line info if `lineinfo`.
#[cfg(feature = "cuda")]
fn calibrate(samples: usize, lineinfo: bool) -> Result<(), Failure> {
    use tracing_gpu::cuda::{calibrate::Calibrator, cudarc::driver::CudaContext};
    if let Some(reason) = demo::no_gpu_reason() {
        return Err(Failure::new(
            Exit::NoGpu,
            format!("cannot calibrate: {reason}"),
        ));
    }
    let n = CudaContext::device_count()
        .map_err(|e| Failure::new(Exit::NoGpu, format!("cannot count the GPUs: {e}")))?;
    let failed = |ordinal: usize, e: &dyn fmt::Display| {
        Failure::new(Exit::Run, format!("GPU {ordinal}: calibration failed: {e}"))
    };
    let mut table = format!(
        "{:<4} {:<22} {:>22} {:>14} {:>10} {:>11} {:>9} {:>6}\n",
        "GPU", "name", "offset (host−device)", "drift", "bound", "used", "min RTT", "step"
    );
    for ordinal in 0..n.max(0) as usize {
        let ctx = CudaContext::new(ordinal).map_err(|e| failed(ordinal, &e))?;
        let name = ctx.name().unwrap_or_else(|_| "?".into());
        let mut calibrator =
            Calibrator::with_lineinfo(&ctx, lineinfo).map_err(|e| failed(ordinal, &e))?;
        let checkpoint = calibrator
            .calibrate(samples)
            .map_err(|e| failed(ordinal, &e))?;
        let map = &checkpoint.map;
        let stats = map.stats();
        table.push_str(&format!(
            "{:<4} {:<22} {:>19} ns {:>+10.3} ppm {:>7} ns {:>5}/{:<5} {:>6} ns {:>3} ns\n",
            ordinal,
            name,
            map.offset_ns(),
            map.drift_ppm(),
            map.bound_ns(),
            stats.used,
            stats.samples,
            stats.min_round_trip_ns,
            calibrator.timer_step_ns()
        ));
    }
    table.push_str(
        "offset and drift map %globaltimer to CLOCK_BOOTTIME (the trace clock); bound: the largest error of that map within the samples' window\n",
    );
    print_out(&table)
}

#[cfg(not(feature = "cuda"))]
fn calibrate(_samples: usize, _lineinfo: bool) -> Result<(), Failure> {
    Err(Failure::new(
        Exit::NoGpu,
        "cannot calibrate: this build has no CUDA support (build with --features cuda, or full)",
    ))
}

/// Prints to stdout; a closed pipe (`| head`) ends the output quietly.
fn print_out(text: &str) -> Result<(), Failure> {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => Err(Failure::new(
            Exit::Output,
            format!("cannot write to stdout: {e}"),
        )),
        _ => Ok(()),
    }
}

/// `out.svg` → `out.gpu1.svg`.
fn per_device_path(path: &Path, ordinal: u32) -> PathBuf {
    beside(path, &format!("gpu{ordinal}"))
}

/// `out.svg` → `out.watchdog.svg`: where `report --svg` draws the watchdog's snapshots.
fn snapshots_path(path: &Path) -> PathBuf {
    beside(path, "watchdog")
}

/// `out.svg` → `out.<tag>.svg`.
fn beside(path: &Path, tag: &str) -> PathBuf {
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.{tag}.{}", ext.to_string_lossy()),
        None => format!("{stem}.{tag}"),
    };
    path.with_file_name(name)
}

/// What `report` gathers for one GPU.
struct DeviceReport {
    /// The statistics (and, unless the SVG draws the busiest launch, the picture).
    timeline: Timeline,
    launches: usize,
    /// The first few kernel names.
    kernels: Vec<String>,
    /// With neither `--launch` nor one launch only: the launch with the most events
    /// (all its parts, if it was streamed), which the SVG draws: id, events.
    busiest: Option<(u64, u64)>,
    /// The events so far of streamed launches whose last part is still to come
    /// (16 bytes a launch: no name).
    streaming: HashMap<u64, u64>,
}

impl DeviceReport {
    /// Notes a kernel's name, among the first few.
    fn kernel(&mut self, kernel: &str) {
        if self.kernels.len() < 4 && !self.kernels.iter().any(|k| k == kernel) {
            self.kernels.push(kernel.to_string());
        }
    }

    /// Counts a launch added whole, with `events` events (all its parts).
    fn launch(&mut self, id: u64, events: u64, draw_busiest: bool) {
        self.launches += 1;
        if draw_busiest && self.busiest.is_none_or(|b| b.1 < events) {
            self.busiest = Some((id, events));
        }
    }
}

/// Adds a launch record to `t`: a launch, or a part of a streamed one.
fn add_launch(t: &mut Timeline, l: &CaptureLaunch) {
    match l.part {
        None => t.add_buffer(&l.buffer.view()),
        Some(part) => t.add_part(l.launch_id, &l.buffer.view(), part.last),
    }
}

fn report(
    capture: &Path,
    svg: Option<&Path>,
    launch: Option<LaunchPick>,
    width: u32,
) -> Result<(), Failure> {
    // A launch record at a time (CaptureReader): memory does not grow with the number
    // of launches nor with a streamed launch's parts; the timelines keep statistics and
    // binned pictures; the busiest launch is read again to be drawn.
    let failure = |e| capture_failure(capture, e);
    let mut reader = CaptureReader::open(capture).map_err(failure)?;
    let count = reader.launch_count();
    if count == 0 {
        print_out(&format!("{}: no launches\n", capture.display()))?;
        return snapshots(reader.head(), svg, launch, None, width);
    }
    let head = reader.head().clone();
    let new_timeline = |d: &CaptureDevice, svg: bool| {
        // The picture is binned launch by launch as they are added, only if asked for.
        let mut t = match svg {
            true => Timeline::with_svg(SvgOptions {
                width,
                ..SvgOptions::default()
            }),
            false => Timeline::new(),
        };
        t.set_names(&head.registry);
        t.set_sm_count(d.info.sm_count);
        t
    };
    // By default the SVG draws the busiest launch.
    let draw_busiest = svg.is_some() && launch.is_none();
    let mut devices: Vec<DeviceReport> = head
        .devices
        .iter()
        .map(|d| DeviceReport {
            timeline: new_timeline(d, svg.is_some() && !draw_busiest),
            launches: 0,
            kernels: Vec::new(),
            busiest: None,
            streaming: HashMap::new(),
        })
        .collect();
    let (mut first_id, mut last_id) = (u64::MAX, 0);
    for l in reader.launches().map_err(failure)? {
        let l = l.map_err(failure)?;
        (first_id, last_id) = (first_id.min(l.launch_id), last_id.max(l.launch_id));
        if launch.is_some_and(|p| p != LaunchPick::All && p != LaunchPick::Id(l.launch_id)) {
            continue;
        }
        let Some(d) = head.devices.iter().position(|d| d.info.ordinal == l.device) else {
            continue; // The reader refuses such a launch; nothing to draw it on.
        };
        let r = &mut devices[d];
        add_launch(&mut r.timeline, &l);
        r.kernel(&l.kernel);
        let events = l.buffer.event_count();
        match l.part {
            None => r.launch(l.launch_id, events, draw_busiest),
            Some(part) => {
                *r.streaming.entry(l.launch_id).or_default() += events;
                if part.last {
                    let events = r.streaming.remove(&l.launch_id).unwrap_or_default();
                    r.launch(l.launch_id, events, draw_busiest);
                }
            }
        }
    }
    // Streamed launches whose last part the capture lacks (the run ended
    // while they ran): what was drained of them.
    for r in &mut devices {
        r.timeline.end_parts();
        let mut open: Vec<_> = r.streaming.drain().collect();
        open.sort_unstable_by_key(|(id, _)| *id);
        for (id, events) in open {
            r.launch(id, events, draw_busiest);
        }
    }
    if let Some(LaunchPick::Id(id)) = launch {
        // A launch that never finished may have only the watchdog's snapshots.
        if devices.iter().all(|r| r.launches == 0) && !head.snapshots().any(|s| s.0 == id) {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "--launch {id}: {} has no launch with that id (its {count} launches have ids {first_id} to {last_id})",
                    capture.display()
                ),
            ));
        }
    }
    let several = devices.iter().filter(|r| r.launches > 0).count() > 1;
    // The first timeline drawn: the snapshots' picture takes its colours.
    let mut first_drawn = None;
    for (device, mut r) in head.devices.iter().zip(devices) {
        if r.launches == 0 {
            continue;
        }
        let names = match r.kernels.len() {
            4 => format!("{}, …", r.kernels[..3].join(", ")),
            _ => r.kernels.join(", "),
        };
        let title = format!(
            "{names} on GPU {} ({})",
            device.info.ordinal, device.info.name
        );
        r.timeline.set_title(title.clone());
        print_out(&format!("{}\n", r.timeline.report()))?;
        let Some(svg) = svg else { continue };
        // What the picture shows, when it is not every launch of the text.
        let mut note = String::new();
        let drawn = match r.busiest.take() {
            Some((id, _)) => {
                // Read again: only its statistics were kept.
                let mut t = new_timeline(device, true);
                let mut kernel = String::new();
                for l in reader.launches().map_err(failure)? {
                    let l = l.map_err(failure)?;
                    if l.launch_id == id && l.device == device.info.ordinal {
                        add_launch(&mut t, &l);
                        kernel = l.kernel;
                    }
                }
                t.end_parts();
                if r.launches > 1 {
                    note = format!(
                        "launch {id} ({kernel}), the one with the most events of {}; --launch ID draws another, --launch all every one on one axis",
                        r.launches
                    );
                    t.set_title(format!("{title}: {note}"));
                } else {
                    t.set_title(title);
                }
                t
            }
            None => r.timeline,
        };
        let Some(picture) = drawn.to_svg() else {
            continue;
        };
        first_drawn.get_or_insert(drawn);
        let path = if several {
            per_device_path(svg, device.info.ordinal)
        } else {
            svg.to_path_buf()
        };
        write_output(&path, picture.as_bytes())?;
        match note.is_empty() {
            true => eprintln!("timeline: {} (open it in a browser)", path.display()),
            false => eprintln!(
                "timeline: {} (open it in a browser): {note}",
                path.display()
            ),
        }
    }
    snapshots(&head, svg, launch, first_drawn.as_ref(), width)
}

/// The watchdog's snapshots of the launches shown (issue #32): their text, and with
/// `svg` their picture beside it (`snapshots_path`), coloured and as wide as `timeline`
/// (without one, `width` wide).
fn snapshots(
    head: &Capture,
    svg: Option<&Path>,
    launch: Option<LaunchPick>,
    timeline: Option<&Timeline>,
    width: u32,
) -> Result<(), Failure> {
    for (id, index, text) in head.snapshots() {
        if launch.is_none_or(|p| p == LaunchPick::All || p == LaunchPick::Id(id)) {
            print_out(&format!(
                "watchdog, snapshot {} of launch {id}:\n{text}\n",
                index + 1
            ))?;
        }
    }
    let Some(svg) = svg else { return Ok(()) };
    let only = match launch {
        Some(LaunchPick::Id(id)) => Some(id),
        _ => None,
    };
    let none = Timeline::with_svg(SvgOptions {
        width,
        ..SvgOptions::default()
    });
    let Some(picture) = timeline.unwrap_or(&none).snapshots_svg(head, only) else {
        return Ok(());
    };
    let path = snapshots_path(svg);
    write_output(&path, picture.as_bytes())?;
    eprintln!(
        "snapshots: {} (open it in a browser): the SMs against their warps' phases when the watchdog looked",
        path.display()
    );
    Ok(())
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Demo {
            out,
            replay,
            capture,
            no_lineinfo,
        } => demo::demo(&out, replay, capture.as_deref(), !no_lineinfo),
        Command::Convert {
            capture,
            out,
            otlp,
            otlp_protocol,
            otlp_timeout,
            otlp_deadline,
            detail,
        } => {
            if let Some(out) = &out {
                refuse_clobbering(&[&capture], &[("trace", out)])?;
            }
            convert::convert(
                &capture,
                out.as_deref(),
                otlp.as_deref().map(|endpoint| convert::OtlpTarget {
                    endpoint,
                    protocol: &otlp_protocol,
                    timeout: otlp_timeout,
                    deadline: otlp_deadline,
                    detail,
                }),
            )
        }
        Command::Calibrate {
            samples,
            no_lineinfo,
        } => calibrate(samples, !no_lineinfo),
        Command::Report {
            capture,
            svg,
            launch,
            width,
        } => {
            if let Some(svg) = &svg {
                let snapshots = snapshots_path(svg);
                refuse_clobbering(
                    &[&capture],
                    &[("timeline", svg), ("snapshots' picture", &snapshots)],
                )?;
            }
            report(&capture, svg.as_deref(), launch, width)
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Without it a signal still ends the process, only leaving a temporary file
    // (`.NAME.XXXXXX.tmp`) behind: no reason to refuse to run.
    let _ = signals::install();
    let result = run(cli);
    if signals::exiting() {
        signals::wait_for_exit();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {f}");
            ExitCode::from(f.exit as u8)
        }
    }
}
