//! tracing-gpu's benchmarks and experiments (not published): the code the binaries of
//! `src/bin/` share.

pub mod gemm;
