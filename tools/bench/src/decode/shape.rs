//! A decode step's model shape: what the command line sets, what it implies (sizes,
//! grids), and the limits `kernels/decode_step.cu` is written for.

use crate::{BenchError, Result};

/// Dimensions of one attention head (`HEAD_DIM` of the kernels).
pub const HEAD_DIM: usize = 128;
/// Cached tokens one attention block covers (`CHUNK`); at most this many splits.
pub const CHUNK: usize = 128;
/// Sequences in a batch, at most (`MAX_BATCH`).
pub const MAX_BATCH: usize = 4;
/// Elements of a row the one-block-per-row kernels hold: 256 threads × `ROW_VECS` × 8.
pub const MAX_ROW: usize = 256 * 4 * 8;
/// Warps of a GEMV block, and output rows of a GEMV warp (`GEMV_WARPS`, `GEMV_ROWS`).
pub const GEMV_WARPS: usize = 4;
/// See [`GEMV_WARPS`].
pub const GEMV_ROWS: usize = 4;
/// Dynamic shared memory a block may take without opting in: the GEMV's staged input.
const SHARED_LIMIT: usize = 48 << 10;

/// The model's and the step's sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    /// Transformer layers.
    pub layers: usize,
    /// Sequences decoded together.
    pub batch: usize,
    /// The residual stream's width: heads × [`HEAD_DIM`].
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key/value heads (grouped-query attention: a divisor of `heads`).
    pub kv_heads: usize,
    /// The MLP's width.
    pub intermediate: usize,
    /// Tokens in the KV cache, the step's own included (its position is `tokens - 1`).
    pub tokens: usize,
    /// Rows of the embedding table.
    pub vocab: usize,
}

impl Shape {
    /// A model small enough for the host's reference, with every edge the kernels
    /// handle: two sequences, grouped-query attention, a partial last split.
    pub fn check() -> Shape {
        Shape {
            layers: 2,
            batch: 2,
            hidden: 256,
            heads: 2,
            kv_heads: 1,
            intermediate: 696,
            tokens: 300,
            vocab: 64,
        }
    }

    /// Whether the kernels can run this shape; why not, if not.
    pub fn validate(&self) -> Result<()> {
        let fail = |why: String| Err(BenchError::Invalid(why));
        if self.layers == 0 || self.batch == 0 || self.tokens == 0 || self.vocab == 0 {
            return fail("layers, batch, tokens and vocab must be positive".into());
        }
        if self.batch > MAX_BATCH {
            return fail(format!("batch {} is over {MAX_BATCH}", self.batch));
        }
        if self.heads == 0 || self.hidden != self.heads * HEAD_DIM {
            return fail(format!(
                "hidden {} must be heads ({}) × {HEAD_DIM}",
                self.hidden, self.heads
            ));
        }
        if self.kv_heads == 0 || !self.heads.is_multiple_of(self.kv_heads) {
            return fail(format!(
                "kv heads {} must divide heads {}",
                self.kv_heads, self.heads
            ));
        }
        if self.hidden > MAX_ROW || self.intermediate == 0 || !self.intermediate.is_multiple_of(8) {
            return fail(format!(
                "hidden must be at most {MAX_ROW}, intermediate a positive multiple of 8 (got {})",
                self.intermediate
            ));
        }
        if self.splits() > CHUNK {
            return fail(format!("tokens {} over {}", self.tokens, CHUNK * CHUNK));
        }
        let shared = self.gemv_shared(self.hidden.max(self.intermediate));
        if shared > SHARED_LIMIT {
            return fail(format!(
                "batch × max(hidden, intermediate) × 2 bytes = {shared} is over {SHARED_LIMIT} \
                 (the GEMV stages its input in shared memory)"
            ));
        }
        Ok(())
    }

    /// Rows of the q/k/v projection: (heads + 2 kv heads) × [`HEAD_DIM`].
    pub fn qkv(&self) -> usize {
        (self.heads + 2 * self.kv_heads) * HEAD_DIM
    }

    /// Attention splits over the cache.
    pub fn splits(&self) -> usize {
        self.tokens.div_ceil(CHUNK)
    }

    /// Elements of one layer's K (or V) cache.
    pub fn cache(&self) -> usize {
        self.batch * self.kv_heads * self.tokens * HEAD_DIM
    }

    /// Bytes of shared memory a GEMV over `cols` columns takes.
    pub fn gemv_shared(&self, cols: usize) -> usize {
        self.batch * cols * 2
    }

    /// Bytes of weights one layer reads (the GEMVs' matrices).
    pub fn layer_weight_bytes(&self) -> usize {
        2 * self.hidden * (self.qkv() + self.hidden + 3 * self.intermediate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn default_shape() -> Shape {
        Shape {
            layers: 16,
            batch: 1,
            hidden: 2048,
            heads: 16,
            kv_heads: 16,
            intermediate: 5632,
            tokens: 2048,
            vocab: 32_000,
        }
    }

    #[test]
    fn the_shapes_the_binary_uses_are_valid() {
        default_shape().validate().unwrap();
        Shape::check().validate().unwrap();
        let s = Shape::check();
        // The reference shape's edges: GQA, a partial split, two sequences.
        assert!(s.heads > s.kv_heads && !s.tokens.is_multiple_of(CHUNK) && s.batch > 1);
        assert_eq!(default_shape().splits(), 16);
        assert_eq!(default_shape().qkv(), 6144);
    }

    #[test]
    fn shapes_the_kernels_cannot_run_are_refused() {
        let d = default_shape();
        for bad in [
            Shape { batch: 5, ..d },
            Shape { heads: 15, ..d },
            Shape { kv_heads: 3, ..d },
            Shape {
                intermediate: 5630,
                ..d
            },
            Shape {
                tokens: CHUNK * CHUNK + 1,
                ..d
            },
            Shape {
                batch: 4,
                intermediate: 11008,
                ..d
            },
            Shape {
                hidden: 128 * 128,
                heads: 128,
                ..d
            },
            Shape { layers: 0, ..d },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
    }
}
