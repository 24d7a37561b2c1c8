// The types of the fused layers' C call (layers.c) and the kernels it calls.
#ifndef LS_LAYERS_H
#define LS_LAYERS_H

#include <stdint.h>

// the kernels of qmatmul.c, rowops.c and attention.c (documented there)
int ls_qmatmul_multi_f32(int nparts, const int *types, const uint8_t *const *ws,
                         const int64_t *ns, const int64_t *row_bytes, const int64_t *cols,
                         int64_t K, const float *x, int64_t ldx, int64_t M, float *y,
                         int64_t ldy, int nthreads);
int ls_rms_norm(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                int64_t HW, float eps, float *y, int nthreads);
int ls_norm_rope(const float *x, int64_t T, int64_t H, int64_t K, int64_t ldt, const float *w,
                 int64_t HW, float eps, const float *cos, const float *sin, float *y,
                 int nthreads);
int ls_attention(const float *q, int64_t ldq, const float *k_cache, const float *v_cache,
                 int64_t S, const int64_t *slots, const int64_t *seq_off, int64_t B,
                 const int32_t *row_seq, const int32_t *row_nkeys, int32_t window, float scale,
                 float *out, int64_t T, int64_t H, int64_t Hkv, int64_t D, int nthreads);
int ls_gated_act(const float *g, const float *u, int64_t T, int64_t F, int64_t ld, int act,
                 float *out, int nthreads);
int ls_lora(int n_ad, const float *const *as, const float *const *bs, const float *const *bts,
            const int64_t *ranks, const float *s, const float *x, int64_t ldx, int64_t T,
            int64_t K, float *y, int64_t ldy, int64_t N, int nthreads);
int ls_lora16(int n_ad, const uint16_t *const *as16, const uint16_t *const *tails,
              const uint16_t *const *bt16s, const int64_t *ranks, const float *s,
              const float *x, int64_t ldx, int64_t T, int64_t K, float *y, int64_t ldy,
              int64_t N, int nthreads);
// mamba2_step.c (unit 0 of the build)
int ls_ssm_dt(const float *raw, int64_t ld, int64_t T, int64_t H, const float *bias,
              const float *a, float *dt, float *da);
int ls_mamba2_step(const float *zx, int64_t ldz, const float *dt, const float *da, int64_t T,
                   const float *const *st_in, float *const *st_out, const float *taps,
                   const float *conv_b, const float *ones, const float *d, const float *norm,
                   float eps, int64_t H, int64_t P, int64_t N, int64_t G, int64_t L, float *out,
                   int vl, int nthreads);

// One projection: up to 8 quantized matrices of one input side by side (q|k|v, gate|up).
typedef struct {
    int32_t nparts;
    int types[8];
    const uint8_t *ws[8];
    int64_t ns[8], row_bytes[8], cols[8];
    int64_t n_out;
    const float *bias;  // [n_out] or NULL
} ls_proj_t;

// A Mamba-2 mixer's own tensors (recurrent/mamba2.py names them): taps [L, C] (C = H P +
// 2 G N), conv_b [C] or NULL, ones [C] of 1.0f, d [H], norm [G, H P / G] or NULL, dt_b [H],
// a [H]; its projections are the layer's qkv (ssm_in) and o (ssm_out).
typedef struct {
    const float *taps, *conv_b, *ones, *d, *norm, *dt_b, *a;
    int64_t H, P, N, G, L;
} ls_mamba_t;

// A gated delta-net mixer's own tensors (recurrent/deltanet.py names them): taps [L, C]
// (C = 2 Hk S + Hv S: q|k|v), ones [C] and ones_s [S] of 1.0f, norm [S], dt_b and a [Hv],
// ba_cols [2 Hv] (beta's then alpha's column among the in-projection's last 2 Hv values);
// eps the output norm's, eps_qk q's and k's L2 norm's (eps / S), scale 1 / sqrt(S) (q, k and
// the output's factor); value head h reads key head h / (Hv / Hk) with interleave, else
// h % Hk. Its projections are the layer's qkv (q|k|v, z, beta|alpha) and o (ssm_out).
// chunk > 0: `--scan-form chunked` (model/recurrent/chunked.py): a record is the conv rows,
// the carried chunk record (gdn_chunk.c), a flag (1.0f: M follows) and M; 0: conv rows, M.
typedef struct {
    const float *taps, *ones, *ones_s, *norm, *dt_b, *a;
    const int64_t *ba_cols;
    float eps, eps_qk, scale;
    int64_t Hk, Hv, S, L;
    int32_t interleave;
    int64_t chunk;
} ls_gdn_t;

// deltanet.c (deltanet_step.h)
int ls_gdn_step(const float *mixed, int64_t ldm, int64_t T, const float *const *st_in,
                float *const *st_out, const ls_gdn_t *w, float *out, int nthreads);

// A short-convolution mixer's own tensor (recurrent/shortconv.py): taps [L, C]; its
// projections are the layer's qkv (in_proj: b|c|x, 3 C) and o (out_proj, C -> hidden).
typedef struct {
    const float *taps;
    int64_t C, L;
} ls_conv_t;

// A layer's feed-forward: gated (act(gate) * up, gate_up [2 F]), none (the mixer alone:
// mamba2, nemotron-h's Mamba-2 and attention layers), or relu(up)^2 with no gate (gate_up
// [F]: nemotron-h's FFN layers).
enum { LS_FFN_GATED = 0, LS_FFN_NONE = 1, LS_FFN_RELU_SQR = 2 };

// A layer's projections that adapters target, each one LoRA slot of 8 parts: qkv, o, gate_up,
// down, and the Mamba-2 mixer's ssm_in and ssm_out where it runs beside attention.
#define LS_PROJS 6

typedef struct {
    ls_proj_t qkv, o, gate_up, down;
    const float *attn_norm;       // [hidden]
    const float *qk_norm;         // [nq + nkv, D] or NULL
    const float *post_attn_norm;  // [hidden] or NULL
    const float *ffn_norm;        // [hidden]
    const float *post_ffn_norm;   // [hidden] or NULL
    int32_t sliding;              // 1: local rope tables and the sliding window
    int64_t norm_n[5];  // the five norms' value counts, in the order above (0 for NULL)
    int32_t rope;       // 0: q and k attend as projected (no rotation; qk_norm NULL)
    const ls_mamba_t *mamba;  // not NULL: this Mamba-2 mixer in place of attention
    const ls_gdn_t *gdn;      // not NULL: this gated delta-net mixer in place of attention
    int32_t ffn_form;         // LS_FFN_*
    int32_t no_mixer;         // 1: no mixer (the FFN alone on ffn_norm: nemotron-h's "ffn")
    const ls_conv_t *conv;    // not NULL: this short-convolution mixer in place of attention
    // beside: 1: the Mamba-2 mixer (mamba, with its projections ssm_in and ssm_out) runs beside
    // the attention on the same normed input, their outputs summed (falcon-h1)
    int32_t beside;
    ls_proj_t ssm_in, ssm_out;
} ls_layer_t;

typedef struct {
    int64_t n_layers, hidden, n_heads, n_kv, head_dim, ffn;
    float eps, attn_scale;
    int32_t act;  // the gated FFNs' activation: 0 SiLU, 1 GELU-tanh
    const ls_layer_t *layers;
    float res_scale;  // each branch's output times this before its residual add (granite)
    int32_t vl;       // torch's float sum width (ssm_scan.vector_lanes), for the Mamba-2 step
    int64_t rope_dim;    // dims of each q/k head rotated: head_dim, or fewer (partial rope)
    int32_t rope_pairs;  // partial rope: 1 rotates pairs (2i, 2i+1), 0 (i, i + rope_dim / 2)
    int32_t out_gate;    // 1: each q head followed by its output gate (qwen35's attention)
} ls_model_t;

// layers.c: out[t, h D + j] = a[t lda + h D + j] * sigmoid(g[t ldg + h hsg + j]), the sigmoid
// in double rounded to float (block.py's gated attention calls it too: the same bits)
int ls_sigmoid_gate(const float *a, int64_t lda, const float *g, int64_t ldg, int64_t hsg,
                    int64_t T, int64_t H, int64_t D, float *out);

// One LoRA target of one adapter: float32 (a, b, bt) or, when the adapter's values are
// halves, float16 alone (a16, bt16, tail16; a and b NULL); neither: the adapter does not
// target this part.
typedef struct {
    const float *a, *b;  // A [rank, in], B [out, rank] float32 contiguous
    int64_t rank;
    float factor;  // multiplies the user scale
    const float *bt;  // B transposed [rank, out] (ls_lora's faster route, the same bits)
    int64_t in, out;  // A's and B's widths: the part's input width and its row count
    // A, B in 8-output tiles and B's rows past the last whole tile, as float16: ls_lora16
    // reads them, half the bytes, the same bits (lora16.c)
    const uint16_t *a16, *bt16, *tail16;
} ls_lora_w;

// The step's adapters (ascending id, as LoraBatch orders them): table [n_active, T] each
// row's user scale (0: not in its mix); ad[j] [n_layers * LS_PROJS * 8] adapter j's targets
// per (layer, projection qkv/o/gate_up/down/ssm_in/ssm_out, part).
typedef struct {
    int32_t n_active;
    const float *table;
    const ls_lora_w *const *ad;
} ls_lora_t;

// One step's metadata (the runner's StepContext, as the Python path reads it).
typedef struct {
    const int64_t *slot_mapping;  // [T] KV slot of each new token
    const int64_t *slots;         // every sequence's KV slots, in position order
    const int64_t *seq_off;       // [B + 1]
    int64_t B;
    const int32_t *row_seq, *row_nkeys;  // [T]
    int32_t window;
    const float *cos_g, *sin_g, *cos_l, *sin_l;  // [T, rope_dim/2] global and local rope tables
    float *const *k_caches;  // [n_layers] pools [S, Hkv, D] float32
    float *const *v_caches;
    int64_t S;
    const ls_lora_t *lora;  // NULL: no adapter in the step
    // [n_layers * T]: recurrent (Mamba-2, delta-net, short conv) layer i's state record of
    // row q's sequence before / after the row at [i * T + q] (every row the one new row of
    // its sequence); NULL without such layers
    const float *const *st_in;
    float *const *st_out;
} ls_step_t;

#endif
