//! The step computed on the host from the same weights and cache, as the kernels compute
//! it (bf16 values rounded to nearest even at the same points, fp32 in between), and the
//! comparison of a GPU result with it: so that the benchmark's kernels are shown to
//! compute a decode step, not to spin.

use super::model::{HostModel, EPS, THETA};
use super::shape::{Shape, HEAD_DIM};

/// A bf16 (raw bits) as f32.
pub fn f(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `x` rounded to bf16, to nearest even (finite values), as the kernels' `to_bf`.
pub fn bf(x: f32) -> u16 {
    let u = x.to_bits();
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// `y[b][r] = Σ_k w[r][k] x[b][k]`, `w` of `rows` × `cols`.
fn gemv(w: &[u16], x: &[u16], rows: usize, cols: usize, batch: usize) -> Vec<u16> {
    let mut y = vec![0u16; batch * rows];
    for b in 0..batch {
        let xb = &x[b * cols..][..cols];
        for r in 0..rows {
            let wr = &w[r * cols..][..cols];
            let s: f32 = wr.iter().zip(xb).map(|(&a, &c)| f(a) * f(c)).sum();
            y[b * rows + r] = bf(s);
        }
    }
    y
}

fn rmsnorm(x: &[u16], w: &[u16], h: usize) -> Vec<u16> {
    x.chunks(h)
        .flat_map(|row| {
            let ss: f32 = row.iter().map(|&v| f(v) * f(v)).sum();
            let inv = 1.0 / (ss / h as f32 + EPS).sqrt();
            row.iter().zip(w).map(move |(&v, &g)| bf(f(v) * inv * f(g)))
        })
        .collect()
}

fn add(x: &mut [u16], y: &[u16]) {
    for (a, &d) in x.iter_mut().zip(y) {
        *a = bf(f(*a) + f(d));
    }
}

/// The residual stream after one step of `m` (shape `s`), `[batch][hidden]`.
pub fn step(s: &Shape, m: &HostModel) -> Vec<u16> {
    let (b, h, i, d) = (s.batch, s.hidden, s.intermediate, HEAD_DIM);
    let (per, pos, t) = (s.heads + 2 * s.kv_heads, s.tokens - 1, s.tokens);
    let (mut kc, mut vc) = (m.k_cache.clone(), m.v_cache.clone());
    let mut x: Vec<u16> = m
        .tokens
        .iter()
        .flat_map(|&tok| m.table[tok as usize * h..][..h].iter().copied())
        .collect();
    let scale = 1.0 / (d as f32).sqrt();
    for l in 0..s.layers {
        let xn = rmsnorm(&x, &m.attn_norm[l * h..][..h], h);
        let wqkv = &m.wqkv[l * s.qkv() * h..][..s.qkv() * h];
        let mut qkv = gemv(wqkv, &xn, s.qkv(), h, b);
        let cache = l * s.cache();
        for (g, head) in qkv.chunks_mut(d).enumerate() {
            let (bi, hd) = (g / per, g % per);
            if hd < s.heads + s.kv_heads {
                for j in 0..d / 2 {
                    let freq = THETA.powf(-((2 * j) as f32) / d as f32);
                    let (sn, cs) = (pos as f32 * freq).sin_cos();
                    let (x1, x2) = (f(head[j]), f(head[j + d / 2]));
                    head[j] = bf(x1 * cs - x2 * sn);
                    head[j + d / 2] = bf(x2 * cs + x1 * sn);
                }
            }
            let into = match hd {
                _ if hd < s.heads => None,
                _ if hd < s.heads + s.kv_heads => Some((&mut kc, hd - s.heads)),
                _ => Some((&mut vc, hd - s.heads - s.kv_heads)),
            };
            if let Some((c, kvh)) = into {
                let at = cache + ((bi * s.kv_heads + kvh) * t + pos) * d;
                c[at..at + d].copy_from_slice(head);
            }
        }
        let mut attn = vec![0u16; b * h];
        for bi in 0..b {
            for hq in 0..s.heads {
                let q = &qkv[(bi * per + hq) * d..][..d];
                let kvh = hq / (s.heads / s.kv_heads);
                let base = cache + (bi * s.kv_heads + kvh) * t * d;
                let scores: Vec<f32> = (0..t)
                    .map(|tok| {
                        let k = &kc[base + tok * d..][..d];
                        q.iter().zip(k).map(|(&a, &c)| f(a) * f(c)).sum::<f32>() * scale
                    })
                    .collect();
                let mx = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let p: Vec<f32> = scores.iter().map(|&v| (v - mx).exp()).collect();
                let sum: f32 = p.iter().sum();
                for e in 0..d {
                    let o: f32 = (0..t).map(|tok| p[tok] * f(vc[base + tok * d + e])).sum();
                    attn[bi * h + hq * d + e] = bf(o / sum);
                }
            }
        }
        add(&mut x, &gemv(&m.wo[l * h * h..][..h * h], &attn, h, h, b));
        let xn = rmsnorm(&x, &m.mlp_norm[l * h..][..h], h);
        let gu = gemv(&m.wgu[l * 2 * i * h..][..2 * i * h], &xn, 2 * i, h, b);
        let act: Vec<u16> = gu
            .chunks(2 * i)
            .flat_map(|row| {
                let (g, up) = row.split_at(i);
                g.iter()
                    .zip(up)
                    .map(|(&g, &u)| bf(f(g) / (1.0 + (-f(g)).exp()) * f(u)))
            })
            .collect();
        add(&mut x, &gemv(&m.wd[l * h * i..][..h * i], &act, h, i, b));
    }
    x
}

/// How far a GPU result is from the reference: `‖got − want‖ / ‖want‖`, and the largest
/// difference; a NaN or an infinity anywhere makes both infinite.
pub fn distance(got: &[u16], want: &[u16]) -> (f64, f64) {
    if got.len() != want.len() || got.iter().chain(want).any(|&v| !f(v).is_finite()) {
        return (f64::INFINITY, f64::INFINITY);
    }
    let (mut diff, mut norm, mut max) = (0.0f64, 0.0f64, 0.0f64);
    for (&g, &w) in got.iter().zip(want) {
        let (g, w) = (f64::from(f(g)), f64::from(f(w)));
        diff += (g - w) * (g - w);
        norm += w * w;
        max = max.max((g - w).abs());
    }
    ((diff / norm.max(f64::MIN_POSITIVE)).sqrt(), max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf(1.0), 0x3f80);
        assert_eq!(f(bf(1.0)), 1.0);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: to the even one, 1.
        assert_eq!(bf(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3 × 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up.
        assert_eq!(bf(1.0 + 3.0 / 256.0), 0x3f82);
        assert_eq!(bf(-2.5), 0xc020);
        assert_eq!(f(bf(f32::INFINITY)), f32::INFINITY);
    }

    #[test]
    fn distance_is_relative_and_refuses_nan() {
        let want = [bf(1.0), bf(-2.0)];
        assert_eq!(distance(&want, &want), (0.0, 0.0));
        let (rel, max) = distance(&[bf(1.0), bf(-1.0)], &want);
        assert!((rel - (1.0f64 / 5.0).sqrt()).abs() < 1e-12 && max == 1.0);
        assert_eq!(distance(&[bf(f32::NAN), bf(1.0)], &want).0, f64::INFINITY);
    }

    /// The check's shape, random values as the GPU fills them: the reference runs over
    /// every index of it and stays finite and near 1 (the scales the model uses).
    #[test]
    fn the_check_shape_steps_to_finite_values() {
        let s = Shape::check();
        let mut state = 12345u32;
        let mut rand = |n: usize, scale: f32, offset: f32| -> Vec<u16> {
            (0..n)
                .map(|_| {
                    state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    bf(offset + scale * ((state >> 8) as f32 / 8_388_608.0 - 1.0))
                })
                .collect()
        };
        let (l, h, i) = (s.layers, s.hidden, s.intermediate);
        let w = |cols: usize| (3.0 / cols as f32).sqrt();
        let m = HostModel {
            table: rand(s.vocab * h, 1.0, 0.0),
            tokens: vec![5, 63],
            attn_norm: rand(l * h, 0.2, 1.0),
            wqkv: rand(l * s.qkv() * h, w(h), 0.0),
            wo: rand(l * h * h, w(h), 0.0),
            mlp_norm: rand(l * h, 0.2, 1.0),
            wgu: rand(l * 2 * i * h, w(h), 0.0),
            wd: rand(l * h * i, w(i), 0.0),
            k_cache: rand(l * s.cache(), 1.0, 0.0),
            v_cache: rand(l * s.cache(), 1.0, 0.0),
        };
        let x = step(&s, &m);
        assert_eq!(x.len(), s.batch * h);
        let rms = (x.iter().map(|&v| f(v) * f(v)).sum::<f32>() / x.len() as f32).sqrt();
        assert!(x.iter().all(|&v| f(v).is_finite()), "{x:?}");
        assert!((0.3..10.0).contains(&rms), "{rms}");
        // The layers moved the stream away from the first sequence's embedding.
        assert!(distance(&x[..h], &m.table[5 * h..][..h]).0 > 0.1);
    }

    #[test]
    fn a_one_layer_step_by_hand() {
        // One sequence, one head: hidden 128, one token in the cache (the step's own),
        // every weight 0, so each GEMV gives 0 and the stream is the embedding.
        let s = Shape {
            layers: 1,
            batch: 1,
            hidden: HEAD_DIM,
            heads: 1,
            kv_heads: 1,
            intermediate: 8,
            tokens: 1,
            vocab: 2,
        };
        let h = s.hidden;
        let m = HostModel {
            table: (0..2 * h).map(|v| bf(v as f32 / 64.0)).collect(),
            tokens: vec![1],
            attn_norm: vec![bf(1.0); h],
            wqkv: vec![0; s.qkv() * h],
            wo: vec![0; h * h],
            mlp_norm: vec![bf(1.0); h],
            wgu: vec![0; 2 * s.intermediate * h],
            wd: vec![0; h * s.intermediate],
            k_cache: vec![0; s.cache()],
            v_cache: vec![0; s.cache()],
        };
        assert_eq!(step(&s, &m), m.table[h..]);
    }
}
