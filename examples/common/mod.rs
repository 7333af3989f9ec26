//! Code shared by the GEMM examples (`gemm`, `overhead`).
pub mod gemm;
