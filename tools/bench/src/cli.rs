//! What the binaries' command lines share: clap argument groups (`--no-lineinfo`,
//! `--size M N K`), `--stream`, value parsers, and the way a run ends (message and exit
//! status).

use std::error::Error;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::str::FromStr;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use tracing_gpu::cuda::KernelBuild;

/// `--no-lineinfo`: the kernels compile without line info (`KernelBuild::lineinfo`).
#[derive(Args, Debug, Clone, Copy)]
pub struct LineInfo {
    /// Compile the kernels without line info: the same machine code, but Nsight Compute
    /// cannot map their SASS to the .cu source.
    #[arg(long = "no-lineinfo")]
    no_lineinfo: bool,
}

impl LineInfo {
    /// Whether the kernels carry line info (the default).
    pub fn on(self) -> bool {
        !self.no_lineinfo
    }
}

/// `--size M N K`: a GEMM's shape.
#[derive(Args, Debug, Clone)]
pub struct Size {
    /// The GEMM's shape: M must be a multiple of 128, N of 256, K of 64.
    #[arg(
        long = "size",
        num_args = 3,
        value_names = ["M", "N", "K"],
        default_values_t = [4096usize, 4096, 4096]
    )]
    size: Vec<usize>,
}

impl Size {
    /// (M, N, K).
    pub fn shape(&self) -> (usize, usize, usize) {
        match self.size[..] {
            [m, n, k] => (m, n, k),
            _ => unreachable!("clap takes exactly three values"),
        }
    }
}

/// `--stream`: the stream launched on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum StreamKind {
    /// The legacy default stream (which synchronizes with every blocking stream).
    #[value(alias = "default")]
    Legacy,
    /// A stream of its own.
    #[value(alias = "new")]
    Own,
}

impl StreamKind {
    /// The name the command line takes.
    pub fn name(self) -> &'static str {
        match self {
            StreamKind::Legacy => "legacy",
            StreamKind::Own => "own",
        }
    }

    /// The legacy stream, or a new one.
    pub fn open(self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>, DriverError> {
        match self {
            StreamKind::Legacy => Ok(ctx.default_stream()),
            StreamKind::Own => ctx.new_stream(),
        }
    }
}

/// A value parser for numbers that must be above zero (counts, periods).
pub fn positive<T>(s: &str) -> Result<T, String>
where
    T: FromStr + PartialOrd + Default,
    T::Err: std::fmt::Display,
{
    let v: T = s.parse().map_err(|e| format!("{e}"))?;
    if v > T::default() {
        Ok(v)
    } else {
        Err("must be positive".into())
    }
}

/// How a run ends: `Ok(true)` succeeds; `Ok(false)` fails (the run printed why); an
/// error is printed as `NAME: error`, and fails.
pub fn exit(name: &str, result: Result<bool, Box<dyn Error>>) -> ExitCode {
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `--header FILE`: a variant of the recorder's header (`kernels/include/tracing_gpu.cuh`),
/// read from a file, for the build with the recorder on. So one call on the GPU machine can
/// run the shipped header beside a variant, with the same binary, instead of packing a
/// binary per variant. The gate-off build keeps the embedded header.
#[derive(Debug, Clone)]
pub struct Header {
    path: PathBuf,
    text: String,
}

impl Header {
    /// Reads `path`; `None` without one.
    pub fn read(path: Option<&Path>) -> Result<Option<Header>, Box<dyn Error>> {
        let Some(path) = path else { return Ok(None) };
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--header {}: {e}", path.display()))?;
        Ok(Some(Header {
            path: path.to_owned(),
            text,
        }))
    }

    /// `source` and `build` with this header in place of the embedded one: the source's
    /// `#include "tracing_gpu.cuh"` names the build's own copy (the embedded header's folder
    /// comes first on the include path, so the name must differ).
    pub fn apply(&self, source: &str, build: KernelBuild) -> (String, KernelBuild) {
        const NAME: &str = "variant/tracing_gpu.cuh";
        (
            source.replace(
                "#include \"tracing_gpu.cuh\"",
                &format!("#include \"{NAME}\""),
            ),
            build.header(NAME, self.text.clone()),
        )
    }
}

/// `source` and `build` as a binary's `--define`s and `--header` change them: the defines
/// added, and the header, if any, in place of the embedded one.
pub fn variant(
    source: &str,
    build: KernelBuild,
    defines: &[String],
    header: Option<&Header>,
) -> (String, KernelBuild) {
    let build = defines.iter().fold(build, |b, d| b.define(d.clone()));
    match header {
        Some(h) => h.apply(source, build),
        None => (source.to_owned(), build),
    }
}

/// How a binary names the recorder's build in its output: `TGPU_ENABLED=1`, the
/// `--define`s added to it and the `--header`, if any.
pub fn recorder_build_with(defines: &[String], header: Option<&Header>) -> String {
    match header {
        Some(h) => format!("{} header={}", recorder_build(defines), h.path.display()),
        None => recorder_build(defines),
    }
}

/// How a binary names the recorder's build in its output: `TGPU_ENABLED=1` and the
/// `--define`s added to it.
pub fn recorder_build(defines: &[String]) -> String {
    std::iter::once("TGPU_ENABLED=1")
        .chain(defines.iter().map(String::as_str))
        .collect::<Vec<_>>()
        .join(" ")
}

/// `s` as a JSON string, quoted and escaped: a `--define` or a header's path may hold
/// quotes or backslashes, and the benchmarks' JSON lines embed them.
pub fn json_string(s: &str) -> String {
    let mut q = String::with_capacity(s.len() + 2);
    q.push('"');
    for c in s.chars() {
        match c {
            '"' => q.push_str("\\\""),
            '\\' => q.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(q, "\\u{:04x}", c as u32);
            }
            c => q.push(c),
        }
    }
    q.push('"');
    q
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_build_with_quotes_and_backslashes_is_one_json_string() {
        let build = recorder_build(&[r#"NAME="a\b""#.to_owned()]);
        assert_eq!(json_string(&build), r#""TGPU_ENABLED=1 NAME=\"a\\b\"""#);
    }
}
