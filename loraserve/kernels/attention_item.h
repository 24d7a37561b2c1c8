// One work item of softmax attention (included by attention.c): the query vectors that read
// the same keys, their scores by fixed-order dot products, the softmax in key order (with
// soft-capping and a sink logit as options) and the weighted sum of values in key order.
// Which vectors share an item changes only the loads, never a vector's operations (the row
// independence attention.c documents).

enum { QV = 16 };  // query vectors per work item, at most

// AVX-512 builds (FMA): the 8-lane steps below run two at a time in 16 lanes, each lane with
// its own operations unchanged (a dot product's two accumulators side by side, 16 values of
// a weighted sum at once), so the same bits as the AVX2 build
#if defined(__AVX512F__) && defined(__AVX512DQ__) && defined(__FMA__)
#define ATT_Z 1
#else
#define ATT_Z 0
#endif

// One score's dot product. AVX2: two 8-lane accumulators over alternate 8-value chunks, an
// odd chunk into the first, their sum, a fixed horizontal sum, then the D % 8 tail in order.
// dot4 computes exactly this for 4 query vectors against one key (loading the key once).
static inline float dot1(const float *q, const float *k, int64_t D) {
    int64_t d = 0;
    float r = 0.0f;
#if defined(__AVX2__)
    __m256 a = _mm256_setzero_ps(), b = _mm256_setzero_ps();
#if ATT_Z
    __m512 ab = _mm512_setzero_ps();  // a's lanes, then b's: the same fma per lane
    for (; d + 16 <= D; d += 16) ab = _mm512_fmadd_ps(_mm512_loadu_ps(q + d), _mm512_loadu_ps(k + d), ab);
    a = _mm512_castps512_ps256(ab), b = _mm512_extractf32x8_ps(ab, 1);
#else
    for (; d + 16 <= D; d += 16) {
        a = madd8(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a);
        b = madd8(_mm256_loadu_ps(q + d + 8), _mm256_loadu_ps(k + d + 8), b);
    }
#endif
    if (d + 8 <= D) {
        a = madd8(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k + d), a);
        d += 8;
    }
    r = hsum8(_mm256_add_ps(a, b));
#endif
    for (; d < D; d++) r += q[d] * k[d];
    return r;
}

#if defined(__AVX2__)
static inline void dot4(const float *const q[4], const float *k, int64_t D, float r[4]) {
    __m256 a[4], b[4];
    for (int i = 0; i < 4; i++) a[i] = b[i] = _mm256_setzero_ps();
    int64_t d = 0;
#if ATT_Z
    __m512 ab[4];  // a[i]'s lanes, then b[i]'s: the same fma per lane
    for (int i = 0; i < 4; i++) ab[i] = _mm512_setzero_ps();
    for (; d + 16 <= D; d += 16) {
        const __m512 kk = _mm512_loadu_ps(k + d);
        for (int i = 0; i < 4; i++) ab[i] = _mm512_fmadd_ps(_mm512_loadu_ps(q[i] + d), kk, ab[i]);
    }
    for (int i = 0; i < 4; i++) a[i] = _mm512_castps512_ps256(ab[i]), b[i] = _mm512_extractf32x8_ps(ab[i], 1);
#else
    for (; d + 16 <= D; d += 16) {
        __m256 k0 = _mm256_loadu_ps(k + d), k1 = _mm256_loadu_ps(k + d + 8);
        for (int i = 0; i < 4; i++) {
            a[i] = madd8(_mm256_loadu_ps(q[i] + d), k0, a[i]);
            b[i] = madd8(_mm256_loadu_ps(q[i] + d + 8), k1, b[i]);
        }
    }
#endif
    int64_t d8 = d;
    if (d + 8 <= D) {
        __m256 k0 = _mm256_loadu_ps(k + d);
        for (int i = 0; i < 4; i++) a[i] = madd8(_mm256_loadu_ps(q[i] + d), k0, a[i]);
        d8 = d + 8;
    }
    for (int i = 0; i < 4; i++) {
        float s = hsum8(_mm256_add_ps(a[i], b[i]));
        for (int64_t e = d8; e < D; e++) s += q[i][e] * k[e];
        r[i] = s;
    }
}
#endif

// The query vectors of one work item: vector i attends keys lo[i] .. hi[i]-1, its scores and
// then weights p live at s[i] (index j - lo[i]), its output at out[i].
typedef struct {
    int64_t n, ulo, uhi;  // vectors; the union of their key ranges
    const float *q[QV];
    float *out[QV], *s[QV], sum[QV], sink[QV];  // sink: the head's sink logit (if sinks)
    int64_t lo[QV], hi[QV];
} item_t;

// The per-call options of ls_attention_ex (see there).
typedef struct {
    float softcap;        // > 0: s = softcap * tanh(s / softcap) after the scale
    const float *sinks;   // [H] per query head, or NULL
    int64_t Dv, ldk, ldv; // value width; floats from one slot's K (V) row to the next
} opts_t;

// exp of one value by the lanes' formula (AVX2), so a sink's term is computed as the scores'
static inline float exp1(float x) {
#if defined(__AVX2__)
    float b[8] = {x, 0, 0, 0, 0, 0, 0, 0};
    _mm256_storeu_ps(b, exp8(_mm256_loadu_ps(b)));
    return b[0];
#else
    return expf(x);
#endif
}

static inline int active(const item_t *it, int i, int64_t j) {
    return i < it->n && j >= it->lo[i] && j < it->hi[i];
}

// o[d] += p[x] * v[x][d] for x = 0 .. nk-1 in this order, every d (nk <= 4): one fma per key
// and value in AVX2 lanes, mul then add in the D % 8 tail, so a value's sequence of
// operations is the same whether its keys come in blocks of 4 or one at a time.
static inline void accumulate(float *o, const float *p, const float *const v[4], int nk,
                              int64_t D) {
    int64_t d = 0;
#if defined(__AVX2__)
    if (nk == 4) {
        __m256 p0 = _mm256_set1_ps(p[0]), p1 = _mm256_set1_ps(p[1]);
        __m256 p2 = _mm256_set1_ps(p[2]), p3 = _mm256_set1_ps(p[3]);
        for (; d + 8 <= D; d += 8) {
            __m256 a = _mm256_loadu_ps(o + d);
            a = madd8(p0, _mm256_loadu_ps(v[0] + d), a);
            a = madd8(p1, _mm256_loadu_ps(v[1] + d), a);
            a = madd8(p2, _mm256_loadu_ps(v[2] + d), a);
            a = madd8(p3, _mm256_loadu_ps(v[3] + d), a);
            _mm256_storeu_ps(o + d, a);
        }
    } else {
        for (; d + 8 <= D; d += 8) {
            __m256 a = _mm256_loadu_ps(o + d);
            for (int x = 0; x < nk; x++)
                a = madd8(_mm256_set1_ps(p[x]), _mm256_loadu_ps(v[x] + d), a);
            _mm256_storeu_ps(o + d, a);
        }
    }
#endif
    for (; d < D; d++)
        for (int x = 0; x < nk; x++) o[d] += p[x] * v[x][d];
}

// out_i = sum_j p_ij v_j / sum_i, accumulated in out_i itself: keys in blocks of 4 (their
// values stay in L1 while every vector attending them takes its share), each vector's keys
// in order lo..hi-1; a key a vector does not attend is skipped, not added as 0 * v.
// D: the values' width.
#if ATT_Z
// weighted_sum's numbers for the vectors i0 .. i0 + nv - 1 (1..4, one key range): each 64
// values of their outputs held in registers over all their keys in order (the same fma per
// lane and key as accumulate's), so no output is read and written again for every 4 keys.
static inline __attribute__((always_inline)) void wsum_z(const item_t *it, int i0, int nv,
                                                         const float *vc, const int64_t *vrow,
                                                         int64_t D) {
    const int64_t lo = it->lo[i0], hi = it->hi[i0], D16 = D / 16 * 16;
    const float *p[4];
    for (int u = 0; u < 4; u++) p[u] = it->s[i0 + (u < nv ? u : 0)] - lo;  // p[u][j]: weight of key j
    for (int64_t d = 0; d < D16; d += 64) {
        const int c = D16 - d >= 64 ? 4 : (int)(D16 - d) / 16;  // 16-lane chunks here
        __m512 a[4][4];
        for (int u = 0; u < 4; u++)
            for (int e = 0; e < 4; e++) a[u][e] = _mm512_setzero_ps();
        for (int64_t j = lo; j < hi; j++) {
            const float *v = vc + vrow[j - it->ulo] + d;
            __m512 w[4];
            for (int e = 0; e < 4; e++) w[e] = e < c ? _mm512_loadu_ps(v + 16 * e) : _mm512_setzero_ps();
            for (int u = 0; u < 4; u++) {
                if (u >= nv) break;
                const __m512 pu = _mm512_set1_ps(p[u][j]);
                for (int e = 0; e < 4; e++)
                    if (e < c) a[u][e] = _mm512_fmadd_ps(pu, w[e], a[u][e]);
            }
        }
        for (int u = 0; u < nv; u++)
            for (int e = 0; e < c; e++) _mm512_storeu_ps(it->out[i0 + u] + d + 16 * e, a[u][e]);
    }
    for (int u = 0; u < nv; u++) {  // the last 8 lanes and the D % 8 tail, as accumulate
        float *o = it->out[i0 + u];
        for (int64_t d = D16; d < D; d++) o[d] = 0.0f;
        for (int64_t j = lo; j < hi; j++) {
            const float *v[4] = {vc + vrow[j - it->ulo] + D16};
            accumulate(o + D16, p[u] + j, (const float *const *)v, 1, D - D16);
        }
    }
}
#endif

static void weighted_sum(const item_t *it, const float *vc, const int64_t *vrow, int64_t D) {
#if ATT_Z
    for (int i = 0; i < it->n;) {  // runs of up to 4 vectors with one key range
        int nv = 1;
        while (nv < 4 && i + nv < it->n && it->lo[i + nv] == it->lo[i] && it->hi[i + nv] == it->hi[i]) nv++;
        if (nv == 4) wsum_z(it, i, 4, vc, vrow, D);
        else if (nv == 3) wsum_z(it, i, 3, vc, vrow, D);
        else if (nv == 2) wsum_z(it, i, 2, vc, vrow, D);
        else wsum_z(it, i, 1, vc, vrow, D);
        i += nv;
    }
    for (int i = 0; i < it->n; i++)
        for (int64_t d = 0; d < D; d++) it->out[i][d] /= it->sum[i];
    return;
#endif
    for (int i = 0; i < it->n; i++)
        for (int64_t d = 0; d < D; d++) it->out[i][d] = 0.0f;
    for (int64_t j0 = it->ulo; j0 < it->uhi; j0 += 4) {
        const int nk = it->uhi - j0 < 4 ? (int)(it->uhi - j0) : 4;
        const float *v[4] = {vc, vc, vc, vc};
        for (int x = 0; x < nk; x++) v[x] = vc + vrow[j0 + x - it->ulo];
        for (int i = 0; i < it->n; i++) {
            const float *p = it->s[i] - it->lo[i];  // p[j]: vector i's weight of key j
            if (it->lo[i] <= j0 && j0 + nk <= it->hi[i]) {
                accumulate(it->out[i], p + j0, v, nk, D);
                continue;
            }
            for (int x = 0; x < nk; x++)
                if (active(it, i, j0 + x)) accumulate(it->out[i], p + j0 + x, v + x, 1, D);
        }
    }
    for (int i = 0; i < it->n; i++)
        for (int64_t d = 0; d < D; d++) it->out[i][d] /= it->sum[i];
}

// s[j] = cap * tanh(s[j] / cap) for j < m (AVX2: whole 8-lane vectors; the padding past m
// is zeros, never read as a score).
static void softcap(float *s, int64_t m, float cap) {
    const float inv = 1.0f / cap;
#if defined(__AVX2__)
    const __m256 vc = _mm256_set1_ps(cap), vi = _mm256_set1_ps(inv);
    for (int64_t j = 0; j < m; j += 8) {
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(s + j), vi);
        _mm256_storeu_ps(s + j, _mm256_mul_ps(vc, tanh8(y)));
    }
#else
    for (int64_t j = 0; j < m; j++) s[j] = cap * tanh1(s[j] * inv);
#endif
}

static void attend(item_t *it, const float *kc, const float *vc, const int64_t *krow,
                   const int64_t *vrow, float scale, int64_t D, const opts_t *o) {
    // scores: each key once, against every vector that attends it (4 at a time)
    for (int64_t j = it->ulo; j < it->uhi; j++) {
        const float *k = kc + krow[j - it->ulo];
        int act[QV], na = 0;
        for (int i = 0; i < it->n; i++)
            if (active(it, i, j)) act[na++] = i;
        int a = 0;
#if defined(__AVX2__)
        for (; a + 4 <= na; a += 4) {
            const float *q4[4] = {it->q[act[a]], it->q[act[a + 1]], it->q[act[a + 2]],
                                  it->q[act[a + 3]]};
            float r[4];
            dot4(q4, k, D, r);
            for (int x = 0; x < 4; x++) it->s[act[a + x]][j - it->lo[act[a + x]]] = r[x];
        }
#endif
        for (; a < na; a++) it->s[act[a]][j - it->lo[act[a]]] = dot1(it->q[act[a]], k, D);
    }
    // softmax weights per vector, in key order
    for (int i = 0; i < it->n; i++) {
        float *s = it->s[i], mx = -INFINITY, sum = 0.0f;
        const int64_t m = it->hi[i] - it->lo[i];
        for (int64_t j = 0; j < m; j++) s[j] *= scale;
#if defined(__AVX2__)
        for (int64_t j = m; j < (m + 7) / 8 * 8; j++) s[j] = 0.0f;  // padding, never used
#endif
        if (o->softcap > 0.0f) softcap(s, m, o->softcap);
        for (int64_t j = 0; j < m; j++) mx = s[j] > mx ? s[j] : mx;
        const float sink = it->sink[i];
        if (o->sinks != NULL && sink > mx) mx = sink;
        if (isnan(mx) || mx == -INFINITY) mx = NAN;  // no finite score: NaN out
#if defined(__AVX2__)
        __m256 vmx = _mm256_set1_ps(mx);
        for (int64_t j = 0; j < m; j += 8)
            _mm256_storeu_ps(s + j, exp8(_mm256_sub_ps(_mm256_loadu_ps(s + j), vmx)));
        for (int64_t j = 0; j < m; j++) sum += s[j];
#else
        for (int64_t j = 0; j < m; j++) {
            s[j] = expf(s[j] - mx);
            sum += s[j];
        }
#endif
        if (o->sinks != NULL) sum += exp1(sink - mx);  // after the keys: the sink's share
        it->sum[i] = sum;
    }
    weighted_sum(it, vc, vrow, o->Dv);
}

