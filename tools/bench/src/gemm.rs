//! Host side of `kernels/gemm.cu`: compile a variant, encode its TMA tensor maps,
//! launch it, and check and time it against cuBLAS.
//!
//! The kernel computes `C = A·B` with A (M×K) row-major, B given as N×K row-major
//! (K×N column-major) and C (M×N) row-major, bf16 in, fp32 accumulation, bf16 or
//! fp32 out. M must be a multiple of [`BM`], N of [`BN`], K of [`BK`].

use std::sync::Arc;

use cudarc::cublas::{result as blas, sys as blas_sys, CudaBlas};
use cudarc::driver::{
    sys, CudaContext, CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig,
    PushKernelArg,
};
use tracing_gpu::cuda::{compile, KernelBuild};
use tracing_gpu::decode::Buffer;
use tracing_gpu::format::KernelArg;
use tracing_gpu::format::{Event, EventKind};
use tracing_gpu::registry::EventRegistry;

use crate::device::{self, Timer};
use crate::kernels::BASELINES;
use crate::{BenchError, Result};

/// The kernel's source.
pub const SOURCE: &str = crate::kernels::GEMM;
/// The kernel's (unmangled) name.
pub const KERNEL: &str = "tgpu_gemm_bf16";
/// Tile rows.
pub const BM: usize = 128;
/// Tile columns.
pub const BN: usize = 256;
/// k-tile depth.
pub const BK: usize = 64;
/// Shared-memory stages.
pub const STAGES: u32 = 4;
/// Threads per block: one producer and two consumer warpgroups.
pub const THREADS: u32 = 384;
/// Warps per block, as the trace buffer's header gives them.
pub const WARPS_PER_BLOCK: u32 = THREADS / 32;
/// Dynamic shared memory per block: the ring, its barriers and 1 KiB of alignment slack
/// (mirrors `gemm::SMEM_BYTES`; the kernel traps if it is given less).
pub const SMEM_BYTES: u32 = STAGES * ((BM + BN) * BK * 2) as u32 + 2 * STAGES * 8 + 1024;

/// The kernel's event types (`TGPU_EVENT` in gemm.cu): id and name, for the registry.
pub const EVENTS: [(u16, &str); 7] = [
    (1, "prod_wait"),
    (2, "load"),
    (3, "wait"),
    (4, "mma"),
    (5, "epilogue"),
    (6, "tile"),
    (7, "release"),
];

/// The registry of [`EVENTS`], for decoding and naming, with what the kernel
/// puts in each payload: the k-tile index for the per-k-tile phases (and the
/// `release` of a stage), the tile index for `epilogue` and `tile`.
pub fn registry() -> EventRegistry {
    let mut r = EventRegistry::from_pairs(EVENTS).expect("EVENTS has distinct ids and names");
    for (id, payload) in [
        (1, "k_tile"),
        (2, "k_tile"),
        (3, "k_tile"),
        (4, "k_tile"),
        (5, "tile"),
        (6, "tile"),
        (7, "k_tile"),
    ] {
        r.declare_payload(id, payload).expect("registered above");
    }
    r
}

/// The tolerance of the checks against cuBLAS: ‖C − ref‖ / ‖ref‖ for bf16 inputs.
pub const TOLERANCE: f64 = 1e-2;

/// Which instrumentation a build carries (on the command line, by [`Variant::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Variant {
    /// No recorder: the production kernel.
    Off,
    /// Our recorder, per-k-tile phases (load per k-tile for the producer, wait and mma
    /// per k-tile and the epilogue for every consumer warp).
    Phases,
    /// [`Variant::Phases`] built with `TGPU_KEEP_SLOT=1`: each warp keeps its slot's
    /// address once found, in registers, instead of finding it at every group store.
    #[value(name = "phases-kept")]
    PhasesKept,
    /// The same phases, recorded by one warp per consumer warpgroup (the four run the
    /// same wgmma in step) and the producer: a quarter of the consumer records.
    PhasesWg,
    /// [`Variant::Phases`] with recorder v1 (`TGPU_FORMAT=1`): 16-byte records.
    #[value(name = "phases-v1")]
    PhasesV1,
    /// [`Variant::PhasesWg`] with recorder v1.
    #[value(name = "phases-wg-v1")]
    PhasesWgV1,
    /// Our recorder, every event: phases plus the producer's wait apart from its load,
    /// a tile range and a release instant per k-tile.
    Full,
    /// The seed's design at the phases' call sites: per-warp counters in global memory,
    /// padded to 128 B, and 5 × i64 records.
    #[value(name = "seed-style")]
    Seed,
    /// FlashInfer's design at the phases' call sites: an 8-byte (tag, time) entry per
    /// begin and per end, interleaved across warps, fenced.
    #[value(name = "flashinfer-style")]
    FlashInfer,
    /// The timer reads alone at the phases' call sites: what any recorder there pays.
    /// Records nothing; each warp that would record stores one word at its flush.
    Stamps,
}

impl Variant {
    /// Every variant, in the order the overhead table lists them.
    pub const ALL: [Variant; 10] = [
        Variant::Off,
        Variant::Phases,
        Variant::PhasesKept,
        Variant::PhasesWg,
        Variant::PhasesV1,
        Variant::PhasesWgV1,
        Variant::Full,
        Variant::Seed,
        Variant::FlashInfer,
        Variant::Stamps,
    ];

    /// A short name for tables and file names.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Off => "off",
            Variant::Phases => "phases",
            Variant::PhasesKept => "phases-kept",
            Variant::PhasesWg => "phases-wg",
            Variant::PhasesV1 => "phases-v1",
            Variant::PhasesWgV1 => "phases-wg-v1",
            Variant::Full => "full",
            Variant::Seed => "seed-style",
            Variant::FlashInfer => "flashinfer-style",
            Variant::Stamps => "stamps",
        }
    }

    /// Whether the kernel takes a trace buffer argument.
    pub fn traced(self) -> bool {
        self != Variant::Off
    }

    /// Whether it records with our recorder (record format v2, or v1 for the `-v1` ones).
    pub fn ours(self) -> bool {
        matches!(
            self,
            Variant::Phases
                | Variant::PhasesKept
                | Variant::PhasesWg
                | Variant::PhasesV1
                | Variant::PhasesWgV1
                | Variant::Full
        )
    }

    fn defines(self) -> &'static [&'static str] {
        match self {
            Variant::Off => &[],
            Variant::Phases => &["TGPU_ENABLED=1", "GEMM_TRACE_LEVEL=1"],
            Variant::PhasesKept => &["TGPU_ENABLED=1", "GEMM_TRACE_LEVEL=1", "TGPU_KEEP_SLOT=1"],
            Variant::PhasesWg => &[
                "TGPU_ENABLED=1",
                "GEMM_TRACE_LEVEL=1",
                "GEMM_TRACE_ONE_WARP=1",
            ],
            Variant::PhasesV1 => &["TGPU_ENABLED=1", "TGPU_FORMAT=1", "GEMM_TRACE_LEVEL=1"],
            Variant::PhasesWgV1 => &[
                "TGPU_ENABLED=1",
                "TGPU_FORMAT=1",
                "GEMM_TRACE_LEVEL=1",
                "GEMM_TRACE_ONE_WARP=1",
            ],
            Variant::Full => &["TGPU_ENABLED=1", "GEMM_TRACE_LEVEL=2"],
            Variant::Seed => &["TGPU_ENABLED=1", "GEMM_TRACE_LEVEL=1", "GEMM_RECORDER=1"],
            Variant::FlashInfer => &["TGPU_ENABLED=1", "GEMM_TRACE_LEVEL=1", "GEMM_RECORDER=2"],
            Variant::Stamps => &["TGPU_ENABLED=1", "GEMM_TRACE_LEVEL=1", "GEMM_RECORDER=3"],
        }
    }

    /// The NVRTC build of this variant (sm_90a: wgmma and setmaxnreg need it).
    pub fn build(self, out: Out) -> KernelBuild {
        let mut b = KernelBuild::new("gemm.cu", "sm_90a").header("baselines.cuh", BASELINES);
        for d in self.defines() {
            b = b.define(*d);
        }
        if out == Out::F32 {
            b = b.define("GEMM_OUT_F32");
        }
        b
    }
}

/// Element type of C.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    /// bf16, rounded to nearest even.
    Bf16,
    /// fp32, the accumulator as it is.
    F32,
}

impl Out {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Out::Bf16 => 2,
            Out::F32 => 4,
        }
    }
}

/// A CUtensorMap as the driver encodes it: 128 opaque bytes, 64-aligned.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct TensorMap([u64; 16]);

// SAFETY: plain bytes, passed by value as a `__grid_constant__` kernel parameter.
unsafe impl DeviceRepr for TensorMap {}

/// Encodes the tensor map of a row-major `rows × cols` bf16 matrix at `ptr`, read in
/// boxes of `box_rows × BK` with the 128-byte swizzle that wgmma's descriptors expect.
fn tensor_map(ptr: u64, rows: usize, cols: usize, box_rows: u32) -> Result<TensorMap> {
    let mut map = TensorMap([0; 16]);
    let dims: [u64; 2] = [cols as u64, rows as u64];
    let strides: [u64; 1] = [cols as u64 * 2];
    let boxes: [u32; 2] = [BK as u32, box_rows];
    let elem_strides: [u32; 2] = [1, 1];
    // SAFETY: every array has the rank's length; `map` is 128 bytes, 64-aligned.
    let r = unsafe {
        sys::cuTensorMapEncodeTiled(
            (&mut map as *mut TensorMap).cast(),
            sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            2,
            ptr as *mut std::ffi::c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            elem_strides.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    };
    r.result()?;
    Ok(map)
}

/// Deterministic uniform bf16 values in [-1, 1) (xorshift64*), as raw bits.
pub fn random_bf16(len: usize, seed: u64) -> Vec<u16> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s >> 12;
            s ^= s << 25;
            s ^= s >> 27;
            let r = s.wrapping_mul(0x2545_F491_4F6C_DD1D);
            let f = (r >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
            f32_to_bf16(f)
        })
        .collect()
}

/// Rounds to nearest even (finite inputs).
pub fn f32_to_bf16(f: f32) -> u16 {
    let b = f.to_bits();
    ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
}

/// Widens bf16 bits to f32.
pub fn bf16_to_f32(b: u16) -> f32 {
    f32::from_bits((b as u32) << 16)
}

/// One problem on the device: inputs, output and the inputs' tensor maps.
pub struct Problem {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of C (rows of the stored B).
    pub n: usize,
    /// The reduction depth.
    pub k: usize,
    /// A, M×K row-major bf16.
    pub a: CudaSlice<u16>,
    /// B, N×K row-major bf16.
    pub b: CudaSlice<u16>,
    /// C, M×N row-major, `out` elements.
    pub c: CudaSlice<u8>,
    /// C's element type.
    pub out: Out,
    maps: [TensorMap; 2],
}

impl Problem {
    /// Uploads fresh random A and B (from `seed`) and allocates C.
    pub fn new(
        stream: &Arc<CudaStream>,
        (m, n, k): (usize, usize, usize),
        out: Out,
        seed: u64,
    ) -> Result<Self> {
        if m == 0 || n == 0 || k == 0 || m % BM != 0 || n % BN != 0 || k % BK != 0 {
            return Err(BenchError::Invalid(format!(
                "GEMM shape {m}×{n}×{k}: M must be a positive multiple of {BM}, N of {BN}, K of {BK}"
            )));
        }
        if m.max(n).max(k) > i32::MAX as usize / 2 {
            return Err(BenchError::Invalid(format!(
                "GEMM shape {m}×{n}×{k} is too large"
            )));
        }
        let a = stream.clone_htod(&random_bf16(m * k, seed))?;
        let b = stream.clone_htod(&random_bf16(n * k, seed ^ 0x9E37_79B9_7F4A_7C15))?;
        // SAFETY: poisoned before every use (`poison`), never read uninitialised.
        let c = unsafe { stream.alloc::<u8>(m * n * out.size()) }?;
        let maps = [
            tensor_map(a.device_ptr(stream).0, m, k, BM as u32)?,
            tensor_map(b.device_ptr(stream).0, n, k, BN as u32)?,
        ];
        Ok(Problem {
            m,
            n,
            k,
            a,
            b,
            c,
            out,
            maps,
        })
    }

    /// Floating-point operations of one product.
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }

    /// Fills C with all-ones bits: NaN in both bf16 and fp32, so an element the kernel
    /// fails to write cannot pass the check.
    pub fn poison(&mut self, stream: &Arc<CudaStream>) -> Result<()> {
        let (ptr, _guard) = self.c.device_ptr(stream);
        // SAFETY: `ptr` spans `self.c.len()` bytes, on this stream.
        unsafe {
            cudarc::driver::result::memset_d8_async(ptr, 0xFF, self.c.len(), stream.cu_stream())
        }?;
        Ok(())
    }

    /// C as f32 values, after the stream is done.
    pub fn c_values(&self, stream: &Arc<CudaStream>) -> Result<Vec<f32>> {
        let bytes = stream.clone_dtoh(&self.c)?;
        Ok(match self.out {
            Out::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]])))
                .collect(),
            Out::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        })
    }
}

/// One compiled variant of the GEMM.
pub struct Gemm {
    func: CudaFunction,
    /// The instrumentation it carries.
    pub variant: Variant,
    /// C's element type it writes.
    pub out: Out,
    sm_count: u32,
}

impl Gemm {
    /// Compiles `variant` with NVRTC (with line info if `lineinfo`) and loads it into `ctx`.
    pub fn compile(
        ctx: &Arc<CudaContext>,
        variant: Variant,
        out: Out,
        lineinfo: bool,
    ) -> Result<Self> {
        Gemm::compile_with(ctx, variant, out, lineinfo, &[])
    }

    /// [`Gemm::compile`] with more defines (`TGPU_STREAM=1`, `GEMM_REPS=N`: gemm.cu).
    pub fn compile_with(
        ctx: &Arc<CudaContext>,
        variant: Variant,
        out: Out,
        lineinfo: bool,
        defines: &[String],
    ) -> Result<Self> {
        let mut build = variant.build(out).lineinfo(lineinfo);
        for d in defines {
            build = build.define(d.as_str());
        }
        let ptx = compile(SOURCE, &build)?;
        let module = ctx.load_module(ptx)?;
        let func = module.load_function(KERNEL)?;
        func.set_attribute(
            sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            SMEM_BYTES as i32,
        )?;
        let sm_count = device::sm_count(ctx)?;
        Ok(Gemm {
            func,
            variant,
            out,
            sm_count,
        })
    }

    /// The launch geometry for `p`: one persistent block per SM (or per tile, if fewer).
    pub fn config(&self, p: &Problem) -> LaunchConfig {
        let tiles = (p.m / BM * (p.n / BN)) as u32;
        LaunchConfig {
            grid_dim: (tiles.min(self.sm_count), 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: SMEM_BYTES,
        }
    }

    /// Tiles each block walks, at most.
    pub fn tiles_per_block(&self, p: &Problem) -> usize {
        let tiles = p.m / BM * (p.n / BN);
        tiles.div_ceil(self.config(p).grid_dim.0 as usize)
    }

    /// Records per warp a trace of a launch on `p` needs room for: at most 3 per k-tile
    /// (wait, mma, release) and 2 per tile (epilogue, tile), for each tile the block walks.
    pub fn capacity(&self, p: &Problem) -> u32 {
        (self.tiles_per_block(p) * (3 * (p.k / BK) + 2)) as u32
    }

    /// Records a launch of this variant writes on `p`, all warps together: the count
    /// the trace must hold (in begin/end pairs for the FlashInfer design).
    pub fn expected_records(&self, p: &Problem) -> u64 {
        let tiles = (p.m / BM * (p.n / BN)) as u64;
        let kt = (p.k / BK) as u64;
        // Per tile: the producer warp records a load per k-tile (and at level 2 its wait
        // apart); each recording consumer warp (all 8, or one per warpgroup) records wait
        // and mma per k-tile and an epilogue, and at level 2 also a tile range and a
        // release instant for every k-tile but the last.
        let (producer, consumer) = match self.variant {
            Variant::Off => return 0,
            // Not records: the warps that would record (the producer and the eight
            // consumers of each block), each storing its word.
            Variant::Stamps => return u64::from(self.config(p).grid_dim.0) * (1 + 8),
            Variant::Full => (2 * kt, 3 * kt + 1),
            Variant::Phases
            | Variant::PhasesKept
            | Variant::PhasesWg
            | Variant::PhasesV1
            | Variant::PhasesWgV1
            | Variant::Seed
            | Variant::FlashInfer => (kt, 2 * kt + 1),
        };
        let consumer_warps = match self.variant {
            Variant::PhasesWg | Variant::PhasesWgV1 => 2,
            _ => 8,
        };
        tiles * (producer + consumer_warps * consumer)
    }

    /// Launches the product on `stream`. `trace` must be given exactly when the variant
    /// is traced: the untraced kernel has no such parameter.
    pub fn launch(
        &self,
        stream: &Arc<CudaStream>,
        p: &mut Problem,
        trace: Option<&KernelArg>,
    ) -> Result<()> {
        if p.out != self.out {
            return Err(BenchError::Invalid(format!(
                "the problem's C is {:?}, the kernel writes {:?}",
                p.out, self.out
            )));
        }
        if trace.is_some() != self.variant.traced() {
            return Err(BenchError::Invalid(format!(
                "variant {} {} a trace argument",
                self.variant.name(),
                if self.variant.traced() {
                    "needs"
                } else {
                    "takes no"
                }
            )));
        }
        let cfg = self.config(p);
        let (m, n, k) = (p.m as i32, p.n as i32, p.k as i32);
        let mut launch = stream.launch_builder(&self.func);
        launch
            .arg(&p.maps[0])
            .arg(&p.maps[1])
            .arg(&mut p.c)
            .arg(&m)
            .arg(&n)
            .arg(&k);
        if let Some(t) = trace {
            launch.arg(t);
        }
        // SAFETY: the arguments match the kernel's parameter list for this variant
        // (checked above), the tensor maps describe `p.a` and `p.b`, and C holds M×N
        // elements of the kernel's output type.
        unsafe { launch.launch(cfg) }?;
        Ok(())
    }
}

/// cuBLAS on the same problem, for the reference and the speed comparison.
pub struct Reference {
    blas: CudaBlas,
    stream: Arc<CudaStream>,
}

impl Reference {
    /// A cuBLAS handle on `stream`.
    pub fn new(stream: &Arc<CudaStream>) -> Result<Self> {
        let blas = CudaBlas::new(stream.clone())?;
        Ok(Reference {
            blas,
            stream: stream.clone(),
        })
    }

    /// `c = A·B` of `p` by cuBLAS, with C of type `out` (M×N row-major, like ours).
    pub fn gemm(&self, p: &Problem, c: &mut CudaSlice<u8>, out: Out) -> Result<()> {
        if c.len() != p.m * p.n * out.size() {
            return Err(BenchError::Invalid(
                "reference output has the wrong size".into(),
            ));
        }
        let stream = &self.stream;
        let (a, _ga) = p.a.device_ptr(stream);
        let (b, _gb) = p.b.device_ptr(stream);
        let (cp, _gc) = c.device_ptr(stream);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let c_type = match out {
            Out::Bf16 => blas_sys::cudaDataType::CUDA_R_16BF,
            Out::F32 => blas_sys::cudaDataType::CUDA_R_32F,
        };
        let (m, n, k) = (p.m as i32, p.n as i32, p.k as i32);
        // Column-major view: Cᵀ (N×M, ld N) = op(B)·op(A) with B stored K×N (ld K,
        // transposed) and A stored K×M (ld K): cuBLAS's "TN" product.
        // SAFETY: the pointers span the sizes given; all on the handle's stream.
        unsafe {
            blas::gemm_ex(
                *self.blas.handle(),
                blas_sys::cublasOperation_t::CUBLAS_OP_T,
                blas_sys::cublasOperation_t::CUBLAS_OP_N,
                n,
                m,
                k,
                (&alpha as *const f32).cast(),
                b as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                k,
                a as *const _,
                blas_sys::cudaDataType::CUDA_R_16BF,
                k,
                (&beta as *const f32).cast(),
                cp as *mut _,
                c_type,
                n,
                blas_sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                blas_sys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(BenchError::Cublas)
    }

    /// The fp32 product of `p` by cuBLAS, on the host: the reference of [`check`].
    pub fn values(&self, p: &Problem) -> Result<Vec<f32>> {
        let mut c = self.output(p, Out::F32)?;
        self.gemm(p, &mut c, Out::F32)?;
        Ok(self
            .stream
            .clone_dtoh(&c)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    /// A C for [`Reference::gemm`] on `p`, of type `out`.
    pub fn output(&self, p: &Problem, out: Out) -> Result<CudaSlice<u8>> {
        // SAFETY: written by cuBLAS before anything reads it.
        Ok(unsafe { self.stream.alloc::<u8>(p.m * p.n * out.size()) }?)
    }
}

/// ‖x − r‖ / ‖r‖ in f64, and the number of non-finite elements of `x`.
pub fn relative_error(x: &[f32], r: &[f32]) -> (f64, usize) {
    let (mut num, mut den, mut bad) = (0.0f64, 0.0f64, 0usize);
    for (&xi, &ri) in x.iter().zip(r) {
        if !xi.is_finite() {
            bad += 1;
            continue;
        }
        let d = xi as f64 - ri as f64;
        num += d * d;
        den += ri as f64 * ri as f64;
    }
    ((num / den).sqrt(), bad)
}

/// One launch checked by [`check`].
#[derive(Debug, Clone, Copy)]
pub struct Checked {
    /// ‖C − ref‖ / ‖ref‖.
    pub err: f64,
    /// What the trace buffer holds (records, or begin/end pairs), if the variant is traced.
    pub recorded: Option<u64>,
    /// What it must hold ([`Gemm::expected_records`]).
    pub want: u64,
}

impl Checked {
    /// Within [`TOLERANCE`], and, if traced, exactly the records expected.
    pub fn pass(&self) -> bool {
        self.err <= TOLERANCE && self.recorded.is_none_or(|r| r == self.want)
    }
}

/// Checks `gemm` against the cuBLAS fp32 result on `p` (`reference`): poisons C, runs
/// it with its trace buffer (`None` for the untraced variant), compares, and counts what
/// the launch recorded. Errs if any element was left unwritten or is not finite.
pub fn check(
    gemm: &Gemm,
    reference: &[f32],
    stream: &Arc<CudaStream>,
    p: &mut Problem,
    trace: Option<&TraceBuffer>,
) -> Result<Checked> {
    p.poison(stream)?;
    gemm.launch(stream, p, trace.map(|t| &t.arg))?;
    stream.synchronize()?;
    let (err, bad) = relative_error(&p.c_values(stream)?, reference);
    if bad != 0 {
        return Err(BenchError::Invalid(format!(
            "{}: {bad} elements of C unwritten or not finite",
            gemm.variant.name()
        )));
    }
    Ok(Checked {
        err,
        recorded: trace.map(|t| t.recorded(stream)).transpose()?,
        want: gemm.expected_records(p),
    })
}

/// Times every kernel of `gemms` (with its trace buffer, if traced) and `extra`
/// (cuBLAS, say) on `p`, in `warmup + reps` rounds that each run all of them once.
/// Returns the milliseconds of the last `reps` rounds: `times[i][round]`, one list per
/// kernel and a last one for `extra`, so that callers can pair kernels round by round.
///
/// Two habits keep the comparison fair. The order rotates by one place every round, so
/// each kernel runs in every position and after every other one equally often (the first
/// kernel after an idle gap or after cuBLAS runs at a different speed). And all rounds are
/// queued before the host waits for any: the GPU never idles between them.
///
/// Before each timed launch (outside the timed region) the same number of bytes is
/// zeroed for every kernel: the seed design's counters, which it reads back, or an
/// equal scratch area for the others, so all launches find the caches alike.
pub fn time_interleaved(
    ctx: &Arc<CudaContext>,
    stream: &Arc<CudaStream>,
    gemms: &[Gemm],
    traces: &mut [Option<TraceBuffer>],
    p: &mut Problem,
    mut extra: impl FnMut(&Problem) -> Result<()>,
    (warmup, reps): (usize, usize),
) -> Result<Vec<Vec<f64>>> {
    let reset = traces
        .iter()
        .flatten()
        .map(TraceBuffer::reset_bytes)
        .max()
        .unwrap_or(0);
    let mut scratch = stream.alloc_zeros::<u8>(reset.max(1))?;
    let kinds = gemms.len() + 1;
    let rounds = warmup + reps;
    let timers = Timer::many(ctx, kinds * rounds)?;
    for round in 0..rounds {
        for step in 0..kinds {
            let i = (round + step) % kinds;
            let timer = &timers[round * kinds + i];
            if i == gemms.len() {
                timer.around(stream, || extra(p))?;
                continue;
            }
            match traces[i].as_mut() {
                Some(t) if t.reset_bytes() > 0 => t.zero_prefix(stream, t.reset_bytes())?,
                _ if reset > 0 => stream.memset_zeros(&mut scratch.slice_mut(..reset))?,
                _ => {}
            }
            let arg = traces[i].as_ref().map(|t| t.arg);
            timer.around(stream, || gemms[i].launch(stream, p, arg.as_ref()))?;
        }
    }
    let mut times = vec![Vec::with_capacity(reps); kinds];
    for round in warmup..rounds {
        for (i, list) in times.iter_mut().enumerate() {
            list.push(timers[round * kinds + i].ms()?);
        }
    }
    Ok(times)
}

/// A device buffer for one traced variant, in that variant's own layout, and the
/// `tgpu::Trace` argument that points the kernel at it.
pub struct TraceBuffer {
    /// The buffer.
    pub buf: CudaSlice<u8>,
    /// The kernel argument.
    pub arg: KernelArg,
    variant: Variant,
}

impl TraceBuffer {
    /// A zeroed buffer sized for `gemm` on `p` (with the wire-format header for our
    /// recorder). Errs for the untraced variant.
    pub fn new(stream: &Arc<CudaStream>, gemm: &Gemm, p: &Problem) -> Result<Self> {
        let cfg = gemm.config(p);
        let slot_count = cfg.grid_dim.0 * WARPS_PER_BLOCK;
        let capacity = gemm.capacity(p);
        let (slots, cap) = (slot_count as usize, capacity as usize);
        let buf = match gemm.variant {
            Variant::Off => {
                return Err(BenchError::Invalid(
                    "the untraced GEMM takes no buffer".into(),
                ))
            }
            Variant::Phases
            | Variant::PhasesKept
            | Variant::PhasesWg
            | Variant::PhasesV1
            | Variant::PhasesWgV1
            | Variant::Full => device::trace_buffer(stream, &cfg, capacity, slot_count)?,
            // 128-byte counters, then 5 × i64 records.
            Variant::Seed => stream.alloc_zeros::<u8>(slots * 128 + slots * cap * 40)?,
            // The {blocks, groups} entry, then two 8-byte entries per range.
            Variant::FlashInfer => stream.alloc_zeros::<u8>(8 * (1 + 2 * slots * cap))?,
            // One word per warp.
            Variant::Stamps => stream.alloc_zeros::<u8>(8 * slots)?,
        };
        let base = buf.device_ptr(stream).0;
        Ok(TraceBuffer {
            buf,
            arg: KernelArg {
                base,
                capacity,
                slot_count,
                ..KernelArg::default()
            },
            variant: gemm.variant,
        })
    }

    /// The buffer of `gemm` on `p` if the variant is traced, `None` for the untraced one.
    pub fn of(stream: &Arc<CudaStream>, gemm: &Gemm, p: &Problem) -> Result<Option<Self>> {
        gemm.variant
            .traced()
            .then(|| TraceBuffer::new(stream, gemm, p))
            .transpose()
    }

    /// [`TraceBuffer::of`] each of `gemms`.
    pub fn all(stream: &Arc<CudaStream>, gemms: &[Gemm], p: &Problem) -> Result<Vec<Option<Self>>> {
        gemms
            .iter()
            .map(|g| TraceBuffer::of(stream, g, p))
            .collect()
    }

    /// Bytes that must be zero again before each launch: the seed design's counters
    /// (it reads them back); the other designs only write.
    pub fn reset_bytes(&self) -> usize {
        match self.variant {
            Variant::Seed => self.arg.slot_count as usize * 128,
            _ => 0,
        }
    }

    /// Zeroes the first `bytes` bytes of the buffer.
    pub fn zero_prefix(&mut self, stream: &Arc<CudaStream>, bytes: usize) -> Result<()> {
        stream.memset_zeros(&mut self.buf.slice_mut(..bytes))?;
        Ok(())
    }

    /// The buffer's bytes, after the stream is done.
    pub fn bytes(&self, stream: &Arc<CudaStream>) -> Result<Vec<u8>> {
        Ok(stream.clone_dtoh(&self.buf)?)
    }

    /// Counts what the last launch recorded, read in the variant's own layout: records
    /// (our recorder, the seed) or begin/end pairs (FlashInfer). Errs on drops.
    pub fn recorded(&self, stream: &Arc<CudaStream>) -> Result<u64> {
        let b = self.bytes(stream)?;
        let u32_at = |at: usize| u32::from_le_bytes(b[at..at + 4].try_into().unwrap());
        let u64_at = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap());
        let slots = self.arg.slot_count as usize;
        match self.variant {
            Variant::Off => Ok(0),
            Variant::Phases
            | Variant::PhasesKept
            | Variant::PhasesWg
            | Variant::PhasesV1
            | Variant::PhasesWgV1
            | Variant::Full => {
                // The strict decoder validates every slot and record on the way.
                let capture = Buffer::decode(&b, Some(&registry()))
                    .map_err(|e| BenchError::Invalid(format!("the trace does not decode: {e}")))?;
                if capture.events_lost() != 0 {
                    return Err(BenchError::Invalid(format!(
                        "{} records dropped",
                        capture.events_lost()
                    )));
                }
                check_contiguous(&capture)?;
                Ok(capture.event_count())
            }
            Variant::Seed => {
                let counts: Vec<u64> = (0..slots).map(|s| u64_at(s * 128)).collect();
                if let Some(c) = counts.iter().find(|&&c| c > self.arg.capacity as u64) {
                    return Err(BenchError::Invalid(format!(
                        "a seed counter reached {c}, over capacity"
                    )));
                }
                Ok(counts.iter().sum())
            }
            Variant::FlashInfer => {
                // Tags are never zero (event ids start at 1); a written entry has one.
                let entries = (8..b.len())
                    .step_by(8)
                    .filter(|&at| u32_at(at) != 0)
                    .count() as u64;
                Ok(entries / 2)
            }
            // A warp's word carries 1 in its high half once stored.
            Variant::Stamps => Ok((0..slots).filter(|&s| u32_at(8 * s + 4) == 1).count() as u64),
        }
    }
}

/// The id of the event type `name` in [`EVENTS`].
fn event_id(name: &str) -> u16 {
    EVENTS
        .iter()
        .find(|e| e.1 == name)
        .map(|e| e.0)
        .expect("an event of gemm.cu")
}

/// Checks that every warp's phases follow each other with neither gap nor overlap. The
/// kernel moves from one phase to the next with `switch_to`, which ends the one and
/// begins the other at one timer read, so each range must start at the nanosecond the
/// range before it ended: except the first of a tile (after an epilogue), and leaving
/// out instants and the tile ranges that enclose the others. A stamp that the compiler
/// read again where it is used (rematerialized) instead of keeping it shows up here.
pub fn check_contiguous(capture: &Buffer) -> Result<()> {
    let (epilogue, tile) = (event_id("epilogue"), event_id("tile"));
    for slot in capture.slots() {
        let mut prev: Option<Event> = None;
        for e in slot.events() {
            if e.kind == EventKind::Instant || e.id == tile {
                continue;
            }
            if let Some(p) = prev.filter(|p| p.id != epilogue) {
                if e.start_ns != p.end_ns {
                    return Err(BenchError::Invalid(format!(
                        "block {} warp {}: event {} (payload {}) starts {} ns after event {} \
                         (payload {}) ends, not at its end",
                        slot.header.block_linear,
                        slot.header.warp,
                        e.id,
                        e.payload,
                        e.start_ns as i64 - p.end_ns as i64,
                        p.id,
                        p.payload
                    )));
                }
            }
            prev = Some(e);
        }
    }
    Ok(())
}
