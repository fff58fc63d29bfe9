// What the int8 decode kernel's software prefetches cost the core, apart from memory: its q.k loop
// (one token's 1 KB K row against 16 query heads, 8 kv heads x 128 dims: vpmovsxbw + vpdpwssd, one
// hsum16 a token) run from L1, alone and with the kernel's two prefetches (next tile's K and V line)
// per 64 bytes read, aimed at lines already in L2 or at a stream from memory.
//
//   MODE 0: q.k alone, K and q in L1
//   MODE 1: the same, 32 prefetcht1 a token into a 512 KiB ring (in L2 after the first pass)
//   MODE 2: the same, 32 prefetcht1 a token walking 1 GiB (two streams from memory)
//   MODE 3: q.k per kv head, its 2 heads' q in registers, 8 tokens a pass (no q reloads)
//
//   gcc -O3 -march=native benchmarks/probes/prefetch_issue_cost.c -o /tmp/pf_cost
//   for m in 0 1 2 3; do /tmp/pf_cost $m; done
#include "probe_util.h"

enum { TILE = 32, ROW = 1024, HEADS = 8, D = 128, LANES = 16 };

// lane i of the result: the sum of a[i]'s 16 int32 lanes
static inline __m512i hsum16(const __m512i* a) {
  __m512i s1[8], s2[4];
  for (int i = 0; i < 8; i++)
    s1[i] = _mm512_add_epi32(_mm512_unpacklo_epi32(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_epi32(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; i++)
    s2[i] = _mm512_add_epi32(_mm512_unpacklo_epi64(s1[2 * i], s1[2 * i + 1]), _mm512_unpackhi_epi64(s1[2 * i], s1[2 * i + 1]));
  const __m512i w01 = _mm512_add_epi32(_mm512_shuffle_i32x4(s2[0], s2[1], 0x88), _mm512_shuffle_i32x4(s2[0], s2[1], 0xdd));
  const __m512i w23 = _mm512_add_epi32(_mm512_shuffle_i32x4(s2[2], s2[3], 0x88), _mm512_shuffle_i32x4(s2[2], s2[3], 0xdd));
  return _mm512_add_epi32(_mm512_shuffle_i32x4(w01, w23, 0x88), _mm512_shuffle_i32x4(w01, w23, 0xdd));
}

int main(int argc, char** argv) {
  const int mode = argc > 1 ? atoi(argv[1]) : 0;
  const long reps = 200000;
  int8_t* K = huge_pages(TILE * ROW, 7);
  int16_t* Q = huge_pages(LANES * D * 2, 3);
  int32_t* out = huge_pages(TILE * LANES * 4, 0);
  const size_t span = mode == 1 ? (size_t)512 << 10 : (size_t)1 << 30;
  char* far = mode == 1 || mode == 2 ? huge_pages(span, 1) : NULL;
  size_t pos = 0;
  const double t0 = now();
  for (long r = 0; r < reps; r++) {
    if (mode == 3) {
      for (int v = 0; v < HEADS; v++) {
        __m512i qv[2][4];
        for (int g = 0; g < 2; g++)
          for (int j = 0; j < 4; j++) qv[g][j] = _mm512_loadu_si512(Q + (v * 2 + g) * D + 32 * j);
        for (int i0 = 0; i0 < TILE; i0 += 8) {
          __m512i a[LANES];
          for (int x = 0; x < LANES; x++) a[x] = _mm512_setzero_si512();
#pragma GCC unroll 4
          for (int j = 0; j < 4; j++)
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) {
              const __m512i k = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(K + (i0 + t) * ROW + v * D + 32 * j)));
              for (int g = 0; g < 2; g++) a[t * 2 + g] = _mm512_dpwssd_epi32(a[t * 2 + g], k, qv[g][j]);
            }
          _mm512_store_si512(out + (i0 + v) * LANES, hsum16(a));
        }
      }
    } else {
      for (int i = 0; i < TILE; i++) {
        __m512i a[LANES];
        for (int x = 0; x < LANES; x++) a[x] = _mm512_setzero_si512();
        for (int c = 0; c < D; c += 32) {
#pragma GCC unroll 8
          for (int v = 0; v < HEADS; v++) {
            if (far && c % 64 == 0) {  // the kernel's next-tile K and V lines
              _mm_prefetch(far + pos, _MM_HINT_T1);
              _mm_prefetch(far + pos + span / 2, _MM_HINT_T1);
              pos = (pos + 64) & (span / 2 - 1);  // span a power of two: no division (a `%` here cost more than the prefetches)
            }
            const __m512i k = _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i*)(K + i * ROW + v * D + c)));
            for (int g = 0; g < 2; g++)
              a[v * 2 + g] = _mm512_dpwssd_epi32(a[v * 2 + g], k, _mm512_loadu_si512(Q + (v * 2 + g) * D + c));
          }
        }
        _mm512_store_si512(out + i * LANES, hsum16(a));
      }
    }
    __asm__ volatile("" ::"r"(out) : "memory");
  }
  const double t = now() - t0;
  const char* names[] = {"q.k alone", "+ 32 prefetches into L2-resident lines", "+ 32 prefetches from memory",
                         "per kv head, q in registers"};
  printf("mode %d (%s): %.1f ns a token\n", mode, names[mode], t / (reps * (double)TILE) * 1e9);
  return 0;
}
