//! `tracing-gpu`: the command-line tool (feature `cli`).
//!
//! It uses only the library's public API: a capture file ([`Dump`]) in, a
//! Perfetto trace, OTLP spans, a report or an SVG timeline out; and, with the
//! `cuda` feature and a GPU, live runs. Every failure is a message on stderr
//! and one of the exit codes below, never a panic.

use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tracing_gpu::dump::{Dump, DumpError};
use tracing_gpu::report::{SvgOptions, Timeline};

/// What `--help` and the README list: one code per kind of failure, so that
/// scripts can tell a bad file from a missing GPU.
const EXIT_CODES: &str = "\
Exit codes:
  0  success
  1  a run failed (a CUDA or driver error during a live run)
  2  bad usage (unknown option, missing argument, launch index out of range)
  3  an input file cannot be read (missing, permission)
  4  an input file is not a valid capture (wrong magic, truncated, corrupt)
  5  an output file cannot be written
  6  no GPU: no NVIDIA driver, no device, or built without the `cuda` feature
  7  OTLP export failed (collector unreachable, or built without `otlp`)";

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
    /// Statistics per event type and per SM, and an SVG timeline of SMs against time.
    #[command(after_help = EXIT_CODES)]
    Report {
        /// The capture file (.tgpu).
        capture: PathBuf,
        /// Also draw the timeline into this SVG file (opens in any browser). With
        /// several GPUs, GPU n's goes to FILE with `.gpu<n>` before the extension.
        #[arg(long, value_name = "FILE")]
        svg: Option<PathBuf>,
        /// Only this launch (its index in the capture, from 0).
        #[arg(long, value_name = "N")]
        launch: Option<usize>,
        /// Width of the SVG's plot area in pixels.
        #[arg(long, value_name = "PX", default_value_t = 1600)]
        width: u32,
    },
}

/// Exit codes, as [`EXIT_CODES`] lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
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

/// Reads a capture, sorting what can go wrong into "cannot read" and "not a capture".
fn read_capture(path: &Path) -> Result<Dump, Failure> {
    Dump::read(path).map_err(|e| match e {
        DumpError::File { source, .. } => Failure::new(
            Exit::Input,
            format!("cannot read {}: {source}", path.display()),
        ),
        DumpError::Io(source) => Failure::new(
            Exit::Input,
            format!("cannot read {}: {source}", path.display()),
        ),
        other => Failure::new(
            Exit::BadCapture,
            format!(
                "{} is not a valid tracing-gpu capture: {other}",
                path.display()
            ),
        ),
    })
}

/// Writes a whole output file, or says which and why not.
fn write_output(path: &Path, bytes: &[u8]) -> Result<(), Failure> {
    std::fs::write(path, bytes).map_err(|e| {
        Failure::new(
            Exit::Output,
            format!("cannot write {}: {e}", path.display()),
        )
    })
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
    let stem = path
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let name = match path.extension() {
        Some(ext) => format!("{stem}.gpu{ordinal}.{}", ext.to_string_lossy()),
        None => format!("{stem}.gpu{ordinal}"),
    };
    path.with_file_name(name)
}

fn report(
    capture: &Path,
    svg: Option<&Path>,
    launch: Option<usize>,
    width: u32,
) -> Result<(), Failure> {
    let dump = read_capture(capture)?;
    if let Some(n) = launch {
        if n >= dump.launches.len() {
            return Err(Failure::new(
                Exit::Usage,
                format!(
                    "--launch {n}: {} holds {} launches (0 to {})",
                    capture.display(),
                    dump.launches.len(),
                    dump.launches.len().saturating_sub(1)
                ),
            ));
        }
    }
    if dump.launches.is_empty() {
        print_out(&format!("{}: no launches\n", capture.display()))?;
        return Ok(());
    }
    let several = dump
        .devices
        .iter()
        .filter(|d| dump.launches.iter().any(|l| l.device == d.info.ordinal))
        .count()
        > 1;
    for device in &dump.devices {
        let launches: Vec<_> = dump
            .launches
            .iter()
            .enumerate()
            .filter(|(i, l)| l.device == device.info.ordinal && launch.is_none_or(|n| n == *i))
            .map(|(_, l)| l)
            .collect();
        if launches.is_empty() {
            continue;
        }
        let mut timeline = Timeline::new();
        timeline.set_names(&dump.registry);
        timeline.set_sm_count(device.info.sm_count);
        let mut kernels: Vec<&str> = launches.iter().map(|l| l.kernel.as_str()).collect();
        kernels.dedup();
        timeline.set_title(format!(
            "{} on GPU {} ({})",
            if kernels.len() == 1 {
                kernels[0].to_string()
            } else {
                kernels.join(", ")
            },
            device.info.ordinal,
            device.info.name
        ));
        for l in &launches {
            timeline.add_capture(&l.capture.view());
        }
        print_out(&format!("{}\n", timeline.report()))?;
        if let Some(svg) = svg {
            let path = if several {
                per_device_path(svg, device.info.ordinal)
            } else {
                svg.to_path_buf()
            };
            let options = SvgOptions {
                width,
                ..SvgOptions::default()
            };
            write_output(&path, timeline.to_svg(&options).as_bytes())?;
            eprintln!("timeline: {} (open it in a browser)", path.display());
        }
    }
    Ok(())
}

fn run(cli: Cli) -> Result<(), Failure> {
    match cli.command {
        Command::Report {
            capture,
            svg,
            launch,
            width,
        } => report(&capture, svg.as_deref(), launch, width),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("error: {f}");
            ExitCode::from(f.exit as u8)
        }
    }
}
