/* L1 distances of a batch's queries to its shared candidates, forward and backward, for
 * lightning_fedkg.models.kge.native_l1 (trainer.native_l1). Plain C built by the system
 * compiler at the first use on a machine (-O3 -march=native -fopenmp) and called through
 * ctypes: the loops are written so that the compiler vectorises the innermost one over the
 * embedding width, and the backward computes both gradients in one pass over the
 * [b, n, w] block (torch.cdist's backward writes that block once per input).
 *
 * Layout: x [b, w], y [n, w], distances and their gradient [b, n], all row-major float32. */
#include <stdint.h>
#include <omp.h>

#define LANES 16 /* partial sums kept apart so the forward's reduction vectorises without -ffast-math */

void l1_forward(const float *x, const float *y, float *out, int64_t b, int64_t n, int64_t w, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < b; ++i) {
    const float *xi = x + i * w;
    for (int64_t j = 0; j < n; ++j) {
      const float *yj = y + j * w;
      float acc[LANES] = {0};
      int64_t k = 0;
      for (; k + LANES <= w; k += LANES)
        for (int l = 0; l < LANES; ++l) {
          float d = xi[k + l] - yj[k + l];
          acc[l] += d < 0 ? -d : d;
        }
      float s = 0;
      for (int l = 0; l < LANES; ++l) s += acc[l];
      for (; k < w; ++k) {
        float d = xi[k] - yj[k];
        s += d < 0 ? -d : d;
      }
      out[i * n + j] = s;
    }
  }
}

/* gx[i,k] = sum_j g[i,j] sign(x[i,k] - y[j,k]) and gy[j,k] = -sum_i g[i,j] sign(x[i,k] - y[j,k]),
 * sign(0) = 0 as in torch. Each thread takes a static range of rows i and sums its part of gy
 * into its own n * w slice of scratch (threads * n * w floats); the slices are then added in
 * thread order, so a given thread count always gives the same bits. */
void l1_backward(const float *x, const float *y, const float *g, float *gx, float *gy, float *scratch,
                 int64_t b, int64_t n, int64_t w, int threads) {
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    float *part = scratch + (int64_t)t * n * w;
    for (int64_t e = 0; e < n * w; ++e) part[e] = 0.f;
    int64_t lo = b * t / nt, hi = b * (t + 1) / nt;
    for (int64_t i = lo; i < hi; ++i) {
      const float *xi = x + i * w, *gi = g + i * n;
      float *gxi = gx + i * w;
      for (int64_t k = 0; k < w; ++k) gxi[k] = 0.f;
      for (int64_t j = 0; j < n; ++j) {
        const float gij = gi[j], *yj = y + j * w;
        float *pj = part + j * w;
        for (int64_t k = 0; k < w; ++k) {
          float d = xi[k] - yj[k];
          float s = d > 0 ? gij : (d < 0 ? -gij : 0.f);
          gxi[k] += s;
          pj[k] -= s;
        }
      }
    }
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t e = 0; e < n * w; ++e) {
      float s = 0.f;
      for (int u = 0; u < nt; ++u) s += scratch[(int64_t)u * n * w + e];
      gy[e] = s;
    }
  }
}
