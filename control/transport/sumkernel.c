/* SPDX-License-Identifier: Apache-2.0
 *
 * The server's summing in one pass (control/transport/sumkernel.py builds
 * and loads this file; control/transport/aggregate.py says the order):
 *
 *     s = w0*x0 + w1*x1;  s = s + w2*x2;  ...;  out = s (*inv | /div)
 *
 * every element alone, each operation a float32 operation rounded once (no
 * contraction into FMA: built with -ffp-contract=off), so the bits are the
 * numpy path's. Each row is read once and the answer written once, with no
 * block of scratch in between; the check for NaN and Inf rides in the same
 * pass (x - x is 0 for a finite x, NaN otherwise; y * 0 for a row that does
 * not count). The vector code is generic: target_clones builds it for
 * AVX-512, AVX2 and the baseline, and the loader picks by the CPU it runs on.
 */
#include <stddef.h>
#include <string.h>

#define W 16
typedef float vf __attribute__((vector_size(W * sizeof(float))));

static inline vf ld(const float *p) { vf v; memcpy(&v, p, sizeof v); return v; }
static inline void st(float *p, vf v) { memcpy(p, &v, sizeof v); }

enum { SCALE_NONE = 0, SCALE_MUL = 1, SCALE_DIV = 2 };

/* out[0, n) from rows[0..k) (w: a weight per row, or NULL for all 1), scaled
 * by mode (SCALE_MUL: times by, SCALE_DIV: divided by by); skip[0..nskip):
 * rows checked for NaN and Inf but not summed. Returns 1 when out and every
 * skipped row are finite, 0 otherwise. */
__attribute__((target_clones("avx512f", "avx2", "default")))
int ltp_sum_rows(const float *const *rows, const float *w, int k,
                 const float *const *skip, int nskip,
                 float *out, size_t n, float by, int mode)
{
    vf bad = {0}, zero = {0};
    float tail = 0;
    size_t i = 0;

    for (; i + W <= n; i += W) {
        vf s = w ? ld(rows[0] + i) * w[0] : ld(rows[0] + i);
        for (int r = 1; r < k; r++)
            s = s + (w ? ld(rows[r] + i) * w[r] : ld(rows[r] + i));
        if (mode == SCALE_MUL)
            s = s * by;
        else if (mode == SCALE_DIV)
            s = s / by;
        bad = bad + (s - s);
        for (int r = 0; r < nskip; r++)
            bad = bad + ld(skip[r] + i) * zero;
        st(out + i, s);
    }
    for (; i < n; i++) {
        float s = w ? rows[0][i] * w[0] : rows[0][i];
        for (int r = 1; r < k; r++)
            s = s + (w ? rows[r][i] * w[r] : rows[r][i]);
        if (mode == SCALE_MUL)
            s = s * by;
        else if (mode == SCALE_DIV)
            s = s / by;
        tail = tail + (s - s);
        for (int r = 0; r < nskip; r++)
            tail = tail + skip[r][i] * 0.0f;
        out[i] = s;
    }
    for (int j = 0; j < W; j++)
        tail = tail + bad[j];
    return tail == 0.0f;
}
