/* hs_math.h: the two functions of libm the sampling needs, so that the preload library
 * does not bring libm into a program that never loads it (half a MiB of its pages in the
 * program's RSS, and one more library in every symbol lookup). Accurate to a few units in
 * the last place over the ranges profile.c uses (tests/test_native.py checks them against
 * libm through hs-math). */
#ifndef HS_MATH_H
#define HS_MATH_H

#include <stdint.h>
#include <string.h>

static const double HS_LN2_HI = 6.93147180369123816490e-01; /* ln 2, its high bits, */
static const double HS_LN2_LO = 1.90821492927058770002e-10; /* and the rest */

/* ln x for a finite x > 0: x = m 2^e with m in [1/sqrt 2, sqrt 2), and ln m = 2 atanh s,
 * s = (m - 1)/(m + 1), |s| < 0.172: the series to s^25 leaves less than 1e-20. */
static inline double hs_log(double x) {
  uint64_t b;
  int e = 0;
  memcpy(&b, &x, sizeof b);
  if ((b >> 52) == 0) { /* subnormal: scale it up first */
    x *= 0x1p54;
    memcpy(&b, &x, sizeof b);
    e = -54;
  }
  e += (int)(b >> 52) - 1023;
  b = (b & 0x000fffffffffffffull) | 0x3ff0000000000000ull; /* m in [1, 2) */
  double m;
  memcpy(&m, &b, sizeof m);
  if (m > 1.4142135623730951) {
    m *= 0.5;
    e++;
  }
  double s = (m - 1) / (m + 1), s2 = s * s, t = 0;
  for (int k = 25; k >= 3; k -= 2) t = (t + 1.0 / k) * s2;
  return e * HS_LN2_HI + (e * HS_LN2_LO + 2 * s * (1 + t));
}

/* e^r - 1 for |r| <= 0.5: Taylor's series to r^18 (the rest is below 1e-22 of it), in
 * Horner's form with 1/k as constants: a division per term cost a sample ~19 divisions,
 * 20-40 cycles each, twice (its allocation and its free). */
static const double HS_INV_K[19] = {0, 1.0, 1.0 / 2, 1.0 / 3, 1.0 / 4, 1.0 / 5, 1.0 / 6,
                                    1.0 / 7, 1.0 / 8, 1.0 / 9, 1.0 / 10, 1.0 / 11, 1.0 / 12,
                                    1.0 / 13, 1.0 / 14, 1.0 / 15, 1.0 / 16, 1.0 / 17, 1.0 / 18};
static inline double hs_expm1_small(double r) {
  double t = 1;
  for (int k = 18; k >= 2; k--) t = 1 + t * (r * HS_INV_K[k]);
  return r * t;
}

/* e^x - 1 for x <= 0 (the sampling probability's -expm1(-s/M)): exact to the last places
 * for tiny |x|, where 1 - e^x would lose them. */
static inline double hs_expm1_neg(double x) {
  if (x > -0.5) return hs_expm1_small(x);
  if (x < -745) return -1;
  /* x = k ln 2 + r, |r| <= ln 2 / 2: e^x = 2^k (1 + expm1 r) */
  double k = (double)(int64_t)(x / 0.6931471805599453 - 0.5);
  double r = (x - k * HS_LN2_HI) - k * HS_LN2_LO;
  if (r > 0.35) { /* rounding left r past ln 2 / 2 */
    k += 1;
    r = (x - k * HS_LN2_HI) - k * HS_LN2_LO;
  }
  double er = 1 + hs_expm1_small(r);
  int64_t kk = (int64_t)k;
  if (kk < -1022) { /* subnormal result: scale in two steps */
    er *= 0x1p-54;
    kk += 54;
  }
  uint64_t pb = (uint64_t)(kk + 1023) << 52;
  double p;
  memcpy(&p, &pb, sizeof p);
  return er * p - 1;
}

#endif
