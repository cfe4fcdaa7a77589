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
 * not count). The vector code is generic C, built three times (AVX-512,
 * AVX2 and the baseline) and chosen once by the CPU it runs on; gcc and
 * clang both build it.
 */
#include <stddef.h>
#include <string.h>

#define W 16
typedef float vf __attribute__((vector_size(W * sizeof(float))));

/* unaligned loads and stores through memcpy (no function takes or returns
 * a vector: that would change the ABI between the clones) */
#define LD(v, p) memcpy(&(v), (p), sizeof(vf))
#define ST(p, v) memcpy((p), &(v), sizeof(vf))

enum { SCALE_NONE = 0, SCALE_MUL = 1, SCALE_DIV = 2 };

#define ARGS const float *const *rows, const float *w, int k, \
             const float *const *skip, int nskip, float *out, size_t n, float by, int mode
#define PASS rows, w, k, skip, nskip, out, n, by, mode

/* out[0, n) from rows[0..k) (w: a weight per row, or NULL for all 1), scaled
 * by mode (SCALE_MUL: times by, SCALE_DIV: divided by by); skip[0..nskip):
 * rows checked for NaN and Inf but not summed. Returns 1 when out and every
 * skipped row are finite, 0 otherwise. Inlined into each ISA's copy below. */
static inline __attribute__((always_inline)) int sum_rows(ARGS)
{
    vf bad = {0}, zero = {0};
    float tail = 0;
    size_t i = 0;

    for (; i + W <= n; i += W) {
        vf s, x;
        LD(s, rows[0] + i);
        if (w)
            s = s * w[0];
        for (int r = 1; r < k; r++) {
            LD(x, rows[r] + i);
            s = s + (w ? x * w[r] : x);
        }
        if (mode == SCALE_MUL)
            s = s * by;
        else if (mode == SCALE_DIV)
            s = s / by;
        bad = bad + (s - s);
        for (int r = 0; r < nskip; r++) {
            LD(x, skip[r] + i);
            bad = bad + x * zero;
        }
        ST(out + i, s);
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

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx512f"))) static int sum_avx512(ARGS) { return sum_rows(PASS); }
__attribute__((target("avx2"))) static int sum_avx2(ARGS) { return sum_rows(PASS); }
#endif
static int sum_base(ARGS) { return sum_rows(PASS); }

static int (*impl)(ARGS);
static int isa;                     /* what impl is: 2 AVX-512, 1 AVX2, 0 the baseline */

/* The copy for `want` (2 AVX-512, 1 AVX2, 0 the baseline) or, if this CPU
 * lacks it, the best it has below; returns the copy chosen. */
int ltp_sum_use(int want)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (want >= 2 && __builtin_cpu_supports("avx512f")) {
        impl = sum_avx512;
        return isa = 2;
    }
    if (want >= 1 && __builtin_cpu_supports("avx2")) {
        impl = sum_avx2;
        return isa = 1;
    }
#endif
    (void)want;
    impl = sum_base;
    return isa = 0;
}

int ltp_sum_rows(ARGS)
{
    if (!impl)
        ltp_sum_use(2);
    return impl(PASS);
}

/* Which copy sums here: 2 AVX-512, 1 AVX2, 0 the baseline. */
int ltp_sum_isa(void)
{
    if (!impl)
        ltp_sum_use(2);
    return isa;
}
