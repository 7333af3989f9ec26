//! One LLM decode step as a CUDA workload (`decode_step`): the model's shape
//! ([`shape`]), its tensors and launches on the GPU ([`model`]), the host's reference
//! ([`reference`]), and the check of what each profiled launch delivered
//! ([`delivered`]). The kernels are `kernels/decode_step.cu`.
//!
//! A step is `embed`, then per layer 12 launches: `rmsnorm`, `gemv_qkv`, `rope` (and the
//! cache append), `attention` (split over the cache), `attn_combine`, `gemv_o`,
//! `residual_add`, `rmsnorm`, `gemv_gate_up`, `silu_mul`, `gemv_down`, `residual_add`:
//! 1 + 12 × layers kernel launches (no final norm or LM head, whose GEMV over the
//! vocabulary would be one long kernel unlike the rest).

pub mod delivered;
pub mod model;
pub mod reference;
pub mod shape;

pub use delivered::{Delivered, Tally};
pub use model::{Builds, HostModel, Node, Step};
pub use shape::Shape;

/// The event types of `decode_step.cu`, as `TGPU_EVENT` declares them.
pub const EVENTS: [(u16, &str); 7] = [
    (1, "load"),
    (2, "compute"),
    (3, "reduce"),
    (4, "store"),
    (5, "score"),
    (6, "softmax"),
    (7, "value"),
];

/// A kernel of `decode_step.cu`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `embed`: each sequence's token's row of the table.
    Embed,
    /// `rmsnorm`.
    RmsNorm,
    /// `gemv`: the projections and the MLP.
    Gemv,
    /// `rope`: rotary embedding of q and k, and the cache append.
    Rope,
    /// `attention`: one split of the cache per block.
    Attention,
    /// `combine`: the splits of each head.
    Combine,
    /// `residual`: `x += y`.
    Residual,
    /// `silu_mul`: the MLP's activation.
    SiluMul,
}

impl Kind {
    /// Every kind, in the order of their discriminants.
    pub const ALL: [Kind; 8] = [
        Kind::Embed,
        Kind::RmsNorm,
        Kind::Gemv,
        Kind::Rope,
        Kind::Attention,
        Kind::Combine,
        Kind::Residual,
        Kind::SiluMul,
    ];

    /// The kernel's name in `decode_step.cu`.
    pub fn entry(self) -> &'static str {
        match self {
            Kind::Embed => "embed",
            Kind::RmsNorm => "rmsnorm",
            Kind::Gemv => "gemv",
            Kind::Rope => "rope",
            Kind::Attention => "attention",
            Kind::Combine => "combine",
            Kind::Residual => "residual",
            Kind::SiluMul => "silu_mul",
        }
    }

    /// Ranges each warp of the kernel records (one per phase, as `decode_step.cu`
    /// writes them).
    pub fn ranges(self) -> u32 {
        match self {
            Kind::Embed => 2,
            Kind::RmsNorm | Kind::Gemv | Kind::Combine => 4,
            Kind::Rope | Kind::Residual | Kind::SiluMul => 3,
            Kind::Attention => 6,
        }
    }

    /// The kernel of a node named `name` ([`Node::name`]).
    pub fn of_node(name: &str) -> Option<Kind> {
        Some(match name {
            "embed" => Kind::Embed,
            "rmsnorm" => Kind::RmsNorm,
            "rope" => Kind::Rope,
            "attention" => Kind::Attention,
            "attn_combine" => Kind::Combine,
            "residual_add" => Kind::Residual,
            "silu_mul" => Kind::SiluMul,
            _ if name.starts_with("gemv_") => Kind::Gemv,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_in_discriminant_order_and_named_once() {
        for (i, k) in Kind::ALL.iter().enumerate() {
            assert_eq!(*k as usize, i);
            assert_eq!(
                Kind::ALL.iter().filter(|o| o.entry() == k.entry()).count(),
                1
            );
        }
    }

    /// Each kernel records as many ranges per warp as `ranges` says: its `rec.begin`
    /// calls plus its `switch_to` calls, in the source.
    #[test]
    fn ranges_match_the_kernel_source() {
        let src = crate::kernels::DECODE_STEP;
        for k in Kind::ALL {
            let start = src
                .find(&format!(" {}(", k.entry()))
                .unwrap_or_else(|| panic!("{k:?} not in the source"));
            let body = &src[start..];
            let body = &body[..body.find("\n}\n").expect("the kernel's end")];
            let opened =
                body.matches("rec.begin<").count() + body.matches("rec.switch_to<").count();
            assert_eq!(opened as u32, k.ranges(), "{k:?}");
            assert_eq!(body.matches("rec.end<").count(), 1, "{k:?}");
        }
    }
}
