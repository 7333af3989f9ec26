//! The decode step on the GPU: its tensors (random weights, a filled KV cache), its
//! kernels in the two builds, and its launches in order (the nodes), which the binary
//! launches one by one or captures into a graph.

use std::sync::Arc;

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, DriverError, LaunchConfig,
    PushKernelArg, ValidAsZeroBits,
};
use tracing_gpu::cuda::{self, KernelBuild, Profiler, ProfilerError, TracedKernel};
use tracing_gpu::format::KernelArg;

use super::shape::{Shape, CHUNK, GEMV_ROWS, GEMV_WARPS, HEAD_DIM};
use super::Kind;
use crate::cli::{self, Header};
use crate::kernels::DECODE_STEP;
use crate::Result;

/// RMSNorm's epsilon, and RoPE's base.
pub const EPS: f32 = 1e-5;
/// See [`EPS`].
pub const THETA: f32 = 10_000.0;

/// `decode_step.cu` compiled without the recorder (the gate off) and with it, for the
/// profiler's GPU: what every [`Step`] launches.
pub struct Builds {
    off: Kernels,
    on: Kernels,
    /// Each kernel's two builds as one `TracedKernel`, by [`Kind`]: what `gpu_profile!`
    /// launches, so that a launch that records nothing runs the build without the recorder,
    /// and a profiled graph can replay without it.
    traced: Vec<TracedKernel>,
}

impl Builds {
    /// Compiles and loads both builds; `defines` (`NAME=VALUE`) are added to the one with
    /// the recorder.
    pub fn load(
        profiler: &Profiler,
        defines: &[String],
        header: Option<&Header>,
    ) -> Result<Arc<Builds>, ProfilerError> {
        let (off, on) = (
            Kernels::load(profiler, None)?,
            Kernels::load(profiler, Some((defines, header)))?,
        );
        let traced = on
            .step
            .iter()
            .zip(&off.step)
            .map(|(r, p)| TracedKernel::new(r.clone(), p.clone()))
            .collect();
        Ok(Arc::new(Builds { off, on, traced }))
    }
}

/// The kernels of one build of `decode_step.cu`, by [`Kind`].
struct Kernels {
    step: Vec<CudaFunction>,
    fill: CudaFunction,
}

impl Kernels {
    /// The build without the recorder (`None`), or with it, `defines` and the header.
    fn load(
        profiler: &Profiler,
        gate: Option<(&[String], Option<&Header>)>,
    ) -> Result<Kernels, ProfilerError> {
        let build = KernelBuild::new("decode_step.cu", profiler.arch());
        let (source, build) = match gate {
            Some((defines, header)) => {
                cli::variant(DECODE_STEP, build.define("TGPU_ENABLED=1"), defines, header)
            }
            None => (DECODE_STEP.to_owned(), build),
        };
        let module = profiler
            .context()
            .load_module(cuda::compile(&source, &build)?)?;
        Ok(Kernels {
            step: Kind::ALL
                .iter()
                .map(|k| module.load_function(k.entry()))
                .collect::<Result<_, _>>()?,
            fill: module.load_function("fill")?,
        })
    }
}

/// A kernel argument of a node, by value.
#[derive(Clone, Copy, Debug)]
enum Arg {
    Ptr(u64),
    U32(u32),
    F32(f32),
}

/// One launch of the step: its kernel, its name in the trace, its shape and arguments.
#[derive(Debug, Clone)]
pub struct Node {
    /// The kernel.
    pub kind: Kind,
    /// Its name in the trace: the kernel's role (`gemv_qkv`, …). Nodes of one name
    /// have one launch shape.
    pub name: &'static str,
    /// The launch shape.
    pub cfg: LaunchConfig,
    args: Vec<Arg>,
}

impl Node {
    /// Warps of the launch.
    pub fn warps(&self) -> u64 {
        let (g, b) = (self.cfg.grid_dim, self.cfg.block_dim);
        u64::from(g.0 * g.1 * g.2) * u64::from((b.0 * b.1 * b.2).div_ceil(32))
    }

    /// Device events the launch records.
    pub fn events(&self) -> u64 {
        self.warps() * u64::from(self.kind.ranges())
    }

    /// Pushes the kernel's own arguments (the trace apart) onto a launch being built.
    fn push_args<'a, L>(&'a self, b: &mut L)
    where
        L: PushKernelArg<&'a u64> + PushKernelArg<&'a u32> + PushKernelArg<&'a f32>,
    {
        for a in &self.args {
            match a {
                Arg::Ptr(p) => b.arg(p),
                Arg::U32(v) => b.arg(v),
                Arg::F32(v) => b.arg(v),
            };
        }
    }
}

/// The step's device memory: weights and cache, bf16 as raw bits.
struct Tensors {
    table: CudaSlice<u16>,
    tokens: CudaSlice<u32>,
    attn_norm: CudaSlice<u16>,
    wqkv: CudaSlice<u16>,
    wo: CudaSlice<u16>,
    mlp_norm: CudaSlice<u16>,
    wgu: CudaSlice<u16>,
    wd: CudaSlice<u16>,
    k_cache: CudaSlice<u16>,
    v_cache: CudaSlice<u16>,
    x: CudaSlice<u16>,
    xn: CudaSlice<u16>,
    qkv: CudaSlice<u16>,
    attn: CudaSlice<u16>,
    y: CudaSlice<u16>,
    gu: CudaSlice<u16>,
    act: CudaSlice<u16>,
    part_o: CudaSlice<f32>,
    part_ml: CudaSlice<f32>,
}

/// The host's copy of what a step reads (for the reference, [`super::reference`]).
pub struct HostModel {
    /// The embedding table, `[vocab][hidden]`.
    pub table: Vec<u16>,
    /// Each sequence's token.
    pub tokens: Vec<u32>,
    /// `[layers][hidden]`.
    pub attn_norm: Vec<u16>,
    /// `[layers][qkv][hidden]`.
    pub wqkv: Vec<u16>,
    /// `[layers][hidden][hidden]`.
    pub wo: Vec<u16>,
    /// `[layers][hidden]`.
    pub mlp_norm: Vec<u16>,
    /// `[layers][2 intermediate][hidden]`: gate rows, then up rows.
    pub wgu: Vec<u16>,
    /// `[layers][hidden][intermediate]`.
    pub wd: Vec<u16>,
    /// `[layers][batch][kv_heads][tokens][HEAD_DIM]`, before the step appends to it.
    pub k_cache: Vec<u16>,
    /// See `k_cache`.
    pub v_cache: Vec<u16>,
}

/// A decode step's model on the GPU, and its kernels built without and with the recorder.
pub struct Step {
    shape: Shape,
    t: Tensors,
    nodes: Vec<Node>,
    builds: Arc<Builds>,
}

fn zeros<T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    n: usize,
) -> Result<CudaSlice<T>, DriverError> {
    stream.alloc_zeros::<T>(n)
}

fn ptr<T>(stream: &CudaStream, s: &CudaSlice<T>, offset: usize) -> Arg {
    let (p, _sync) = s.device_ptr(stream);
    Arg::Ptr(p + (offset * std::mem::size_of::<T>()) as u64)
}

impl Step {
    /// Allocates the model of `shape` on `stream` (random weights and cache from
    /// `seed`, filled by `builds`) and plans the step's launches.
    pub fn new(
        builds: &Arc<Builds>,
        stream: &Arc<CudaStream>,
        shape: Shape,
        seed: u32,
    ) -> Result<Step, ProfilerError> {
        shape.validate()?;
        let s = shape;
        let (l, h, i) = (s.layers, s.hidden, s.intermediate);
        let t = Tensors {
            table: zeros(stream, s.vocab * h)?,
            tokens: stream.clone_htod(
                &(0..s.batch as u32)
                    .map(|b| (b * 7 + seed) % s.vocab as u32)
                    .collect::<Vec<_>>(),
            )?,
            attn_norm: zeros(stream, l * h)?,
            wqkv: zeros(stream, l * s.qkv() * h)?,
            wo: zeros(stream, l * h * h)?,
            mlp_norm: zeros(stream, l * h)?,
            wgu: zeros(stream, l * 2 * i * h)?,
            wd: zeros(stream, l * h * i)?,
            k_cache: zeros(stream, l * s.cache())?,
            v_cache: zeros(stream, l * s.cache())?,
            x: zeros(stream, s.batch * h)?,
            xn: zeros(stream, s.batch * h)?,
            qkv: zeros(stream, s.batch * s.qkv())?,
            attn: zeros(stream, s.batch * h)?,
            y: zeros(stream, s.batch * h)?,
            gu: zeros(stream, s.batch * 2 * i)?,
            act: zeros(stream, s.batch * i)?,
            part_o: zeros(stream, s.batch * s.heads * s.splits() * HEAD_DIM)?,
            part_ml: zeros(stream, s.batch * s.heads * s.splits() * 2)?,
        };
        let step = Step {
            shape,
            nodes: plan(stream, &shape, &t),
            t,
            builds: builds.clone(),
        };
        step.randomize(stream, seed)?;
        Ok(step)
    }

    /// Fills the weights, the table and the cache: uniform values whose scales keep the
    /// activations near 1 (a GEMV's weights ±√(3 / columns)).
    fn randomize(&self, stream: &Arc<CudaStream>, seed: u32) -> Result<(), DriverError> {
        let (h, i) = (self.shape.hidden as f32, self.shape.intermediate as f32);
        let t = &self.t;
        let fills: [(&CudaSlice<u16>, f32, f32); 9] = [
            (&t.table, 1.0, 0.0),
            (&t.attn_norm, 0.2, 1.0),
            (&t.wqkv, (3.0 / h).sqrt(), 0.0),
            (&t.wo, (3.0 / h).sqrt(), 0.0),
            (&t.mlp_norm, 0.2, 1.0),
            (&t.wgu, (3.0 / h).sqrt(), 0.0),
            (&t.wd, (3.0 / i).sqrt(), 0.0),
            (&t.k_cache, 1.0, 0.0),
            (&t.v_cache, 1.0, 0.0),
        ];
        for (k, (buf, scale, offset)) in fills.into_iter().enumerate() {
            let n = buf.len() as u64;
            let salt = seed.wrapping_mul(0x9E37_79B9) ^ (k as u32 + 1).wrapping_mul(0x85EB_CA6B);
            let cfg = LaunchConfig {
                grid_dim: (n.div_ceil(256).min(4096) as u32, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: fill(bf16*, u64, u32, f32, f32) over the buffer's n elements.
            unsafe {
                stream
                    .launch_builder(&self.builds.off.fill)
                    .arg(buf)
                    .arg(&n)
                    .arg(&salt)
                    .arg(&scale)
                    .arg(&offset)
                    .launch(cfg)?;
            }
        }
        Ok(())
    }

    /// The model's shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The step's launches, in order.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Device events one step records (every node profiled).
    pub fn events(&self) -> u64 {
        self.nodes.iter().map(Node::events).sum()
    }

    /// Enqueues node `i` of the build without the recorder (no trace) on `stream`.
    pub fn launch_off(&self, stream: &CudaStream, i: usize) -> Result<(), DriverError> {
        self.launch_with(stream, &self.builds.off, i, None)
    }

    /// Enqueues node `i` of the recorder's build on `stream`, recording into `trace`
    /// (nothing if its base is 0).
    pub fn launch(
        &self,
        stream: &CudaStream,
        i: usize,
        trace: &KernelArg,
    ) -> Result<(), DriverError> {
        self.launch_with(stream, &self.builds.on, i, Some(trace))
    }

    /// Enqueues node `i` as a `TracedKernel` on `stream`: the recorder's build recording
    /// into `trace`, or, if `trace` records nothing, the build without the recorder.
    pub fn launch_traced(
        &self,
        stream: &CudaStream,
        i: usize,
        trace: &KernelArg,
    ) -> Result<(), DriverError> {
        let node = &self.nodes[i];
        let mut b = self.builds.traced[node.kind as usize].launch_builder(stream, trace);
        node.push_args(&mut b);
        // SAFETY: as in `launch_with`; the TracedLaunch appends the trace if it records.
        unsafe { b.launch(node.cfg) }?;
        Ok(())
    }

    fn launch_with(
        &self,
        stream: &CudaStream,
        build: &Kernels,
        i: usize,
        trace: Option<&KernelArg>,
    ) -> Result<(), DriverError> {
        let node = &self.nodes[i];
        let mut b = stream.launch_builder(&build.step[node.kind as usize]);
        node.push_args(&mut b);
        if let Some(t) = trace {
            b.arg(t);
        }
        // SAFETY: `plan` gave the node its kernel's arguments, into tensors of `self`
        // (alive as long as it is) sized by the shape `plan` checked; the trace is the
        // last parameter of the recorder's build only.
        unsafe { b.launch(node.cfg) }?;
        Ok(())
    }

    /// The residual stream after the step, `[batch][hidden]` (waits for `stream`).
    pub fn output(&self, stream: &Arc<CudaStream>) -> Result<Vec<u16>, DriverError> {
        stream.clone_dtoh(&self.t.x)
    }

    /// What the step reads, copied to the host (waits for `stream`).
    pub fn host(&self, stream: &Arc<CudaStream>) -> Result<HostModel, DriverError> {
        let t = &self.t;
        Ok(HostModel {
            table: stream.clone_dtoh(&t.table)?,
            tokens: stream.clone_dtoh(&t.tokens)?,
            attn_norm: stream.clone_dtoh(&t.attn_norm)?,
            wqkv: stream.clone_dtoh(&t.wqkv)?,
            wo: stream.clone_dtoh(&t.wo)?,
            mlp_norm: stream.clone_dtoh(&t.mlp_norm)?,
            wgu: stream.clone_dtoh(&t.wgu)?,
            wd: stream.clone_dtoh(&t.wd)?,
            k_cache: stream.clone_dtoh(&t.k_cache)?,
            v_cache: stream.clone_dtoh(&t.v_cache)?,
        })
    }
}

fn cfg(grid: (usize, usize, usize), block: usize, shared: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (grid.0 as u32, grid.1 as u32, grid.2 as u32),
        block_dim: (block as u32, 1, 1),
        shared_mem_bytes: shared as u32,
    }
}

/// The step's launches over the tensors `t` (checked against `shape` by the caller).
fn plan(stream: &CudaStream, s: &Shape, t: &Tensors) -> Vec<Node> {
    let (b, h, i) = (s.batch, s.hidden, s.intermediate);
    let u = |v: usize| Arg::U32(v as u32);
    let node = |kind, name, cfg, args| Node {
        kind,
        name,
        cfg,
        args,
    };
    let gemv = |name, w: Arg, x: &CudaSlice<u16>, y: &CudaSlice<u16>, rows: usize, cols| {
        let per_block = GEMV_WARPS * GEMV_ROWS;
        node(
            Kind::Gemv,
            name,
            cfg(
                (rows.div_ceil(per_block), 1, 1),
                GEMV_WARPS * 32,
                s.gemv_shared(cols),
            ),
            vec![
                w,
                ptr(stream, x, 0),
                ptr(stream, y, 0),
                u(rows),
                u(cols),
                u(b),
            ],
        )
    };
    let rmsnorm = |w: Arg| {
        node(
            Kind::RmsNorm,
            "rmsnorm",
            cfg((b, 1, 1), 256, 0),
            vec![
                ptr(stream, &t.x, 0),
                w,
                ptr(stream, &t.xn, 0),
                u(h),
                Arg::F32(EPS),
            ],
        )
    };
    let residual = || {
        node(
            Kind::Residual,
            "residual_add",
            cfg(((b * h / 8).div_ceil(256), 1, 1), 256, 0),
            vec![ptr(stream, &t.x, 0), ptr(stream, &t.y, 0), u(b * h / 8)],
        )
    };
    let mut nodes = vec![node(
        Kind::Embed,
        "embed",
        cfg((b, 1, 1), 256, 0),
        vec![
            ptr(stream, &t.table, 0),
            ptr(stream, &t.tokens, 0),
            ptr(stream, &t.x, 0),
            u(h),
        ],
    )];
    for l in 0..s.layers {
        let cache = l * s.cache();
        nodes.push(rmsnorm(ptr(stream, &t.attn_norm, l * h)));
        let wqkv = ptr(stream, &t.wqkv, l * s.qkv() * h);
        nodes.push(gemv("gemv_qkv", wqkv, &t.xn, &t.qkv, s.qkv(), h));
        nodes.push(node(
            Kind::Rope,
            "rope",
            cfg(((b * (s.heads + 2 * s.kv_heads)).div_ceil(4), 1, 1), 128, 0),
            vec![
                ptr(stream, &t.qkv, 0),
                ptr(stream, &t.k_cache, cache),
                ptr(stream, &t.v_cache, cache),
                u(s.heads),
                u(s.kv_heads),
                u(b),
                u(s.tokens - 1),
                u(s.tokens),
                Arg::F32(THETA),
            ],
        ));
        nodes.push(node(
            Kind::Attention,
            "attention",
            cfg((s.splits(), s.heads, b), CHUNK, 0),
            vec![
                ptr(stream, &t.qkv, 0),
                ptr(stream, &t.k_cache, cache),
                ptr(stream, &t.v_cache, cache),
                ptr(stream, &t.part_o, 0),
                ptr(stream, &t.part_ml, 0),
                u(s.heads),
                u(s.kv_heads),
                u(s.tokens),
                u(s.tokens),
                Arg::F32(1.0 / (HEAD_DIM as f32).sqrt()),
            ],
        ));
        nodes.push(node(
            Kind::Combine,
            "attn_combine",
            cfg((s.heads, b, 1), HEAD_DIM, 0),
            vec![
                ptr(stream, &t.part_o, 0),
                ptr(stream, &t.part_ml, 0),
                ptr(stream, &t.attn, 0),
                u(s.heads),
                u(s.splits()),
            ],
        ));
        let wo = ptr(stream, &t.wo, l * h * h);
        nodes.push(gemv("gemv_o", wo, &t.attn, &t.y, h, h));
        nodes.push(residual());
        nodes.push(rmsnorm(ptr(stream, &t.mlp_norm, l * h)));
        let wgu = ptr(stream, &t.wgu, l * 2 * i * h);
        nodes.push(gemv("gemv_gate_up", wgu, &t.xn, &t.gu, 2 * i, h));
        nodes.push(node(
            Kind::SiluMul,
            "silu_mul",
            cfg(((b * i / 8).div_ceil(256), 1, 1), 256, 0),
            vec![ptr(stream, &t.gu, 0), ptr(stream, &t.act, 0), u(i), u(b)],
        ));
        let wd = ptr(stream, &t.wd, l * h * i);
        nodes.push(gemv("gemv_down", wd, &t.act, &t.y, h, i));
        nodes.push(residual());
    }
    nodes
}
