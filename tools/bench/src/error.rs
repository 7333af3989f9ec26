//! The benchmarks' error type: the library's CUDA errors, and what only the benchmarks
//! meet (cuBLAS, a problem the GEMM cannot take, a trace that is not what was expected).

use cudarc::cublas::result::CublasError;
use cudarc::driver::DriverError;
use tracing_gpu::cuda::{CudaError, ProfilerError};

/// Errors of the benchmarks' shared code.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Loading the CUDA libraries, or compiling a kernel.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// A driver call failed.
    #[error("CUDA driver error: {0}")]
    Driver(#[from] DriverError),
    /// cuBLAS failed.
    #[error("cuBLAS error: {0:?}")]
    Cublas(#[from] CublasError),
    /// Anything else that is wrong with a request or a result (sizes, arguments, a
    /// trace that does not hold what it must).
    #[error("{0}")]
    Invalid(String),
}

/// The benchmarks' result.
pub type Result<T, E = BenchError> = std::result::Result<T, E>;

/// So that a launch closure of `gpu_profile!` can return the benchmarks' errors: the
/// library's own errors as they are, the rest as invalid requests.
impl From<BenchError> for ProfilerError {
    fn from(e: BenchError) -> Self {
        match e {
            BenchError::Cuda(e) => ProfilerError::Cuda(e),
            BenchError::Driver(e) => ProfilerError::from(e),
            other => ProfilerError::Invalid(other.to_string()),
        }
    }
}
