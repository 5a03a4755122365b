/* Which of the ISA copies of kernels.c this CPU can run, and a default entry point.
 *
 * ISAs by number, slowest first: 0 generic, 1 avx2, 2 avxvnni, 3 avx512, 4 neon, 5 amx, 6 neondot
 * (neon with the dot product instructions, FEAT_DotProd, asked of the kernel's HWCAP). setup.py
 * defines EMBER_HAS_<ISA> for each copy it compiled; a copy is usable where it was compiled and
 * the CPU has its features (avx2: AVX2 + FMA + F16C; avxvnni: AVX-VNNI as well, the 256-bit
 * vpdpbusd/vpdpwssd of Intel's cores since Alder Lake; avx512: AVX-512 F/BW/VL/VNNI; amx:
 * avx512's and AMX's int8 tiles, Intel's Xeons since Sapphire Rapids, where the kernel lets the
 * process have their state). */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

/* AVX-VNNI: CPUID leaf 7, subleaf 1, EAX bit 4 (asked directly: older compilers' cpu-feature
 * builtins do not know its name) */
static int em_has_avxvnni(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a >> 4 & 1);
}

/* AMX-TILE and AMX-INT8: CPUID leaf 7, subleaf 0, EDX bits 24 and 25 */
static int em_has_amx_int8(void) {
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 24 & 3) == 3;
}

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif
/* Linux hands a process the tiles' state once asked (ARCH_REQ_XCOMP_PERM, XTILEDATA); a kernel
 * without it, or a hypervisor that hides it, refuses; other systems are not asked. Also asked by
 * the amx copy's kernels (amx.h) before they take the tiles. */
int ember_amx_permitted(void) {
#if defined(__linux__) && defined(__x86_64__)
    static int answer = -1;
    if (answer < 0) answer = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    return answer;
#else
    return 0;
#endif
}
#endif

#if defined(__aarch64__)
#if defined(__linux__)
#include <sys/auxv.h>
#endif

/* FEAT_DotProd (sdot/udot): HWCAP_ASIMDDP, bit 20 of AT_HWCAP on Linux (asked by number:
 * older headers lack the name); 0 elsewhere, where the neon copy runs */
static int em_has_dotprod(void) {
#if defined(__linux__)
    return (getauxval(AT_HWCAP) >> 20) & 1;
#else
    return 0;
#endif
}
#endif

#define EM_API __attribute__((visibility("default")))

EM_API int ember_num_threads = 0; /* threads of the kernels' parallel loops; 0 = OpenMP's default */

EM_API void ember_set_threads(int n) { ember_num_threads = n > 0 ? n : 0; }

/* Three prefetch choices that differ between the CPUs measured (docs/speed-log.md), made by the
 * CPU's vendor as the library loads (a benchmark may set them):
 * - ember_kq_pf_ahead: how many bytes past a K-type block decode's kernels ask for the weight's
 *   next lines (kquants.h's KQ_PREFETCH), enough to hide memory's latency at one thread's share
 *   of its bandwidth. The 3B-shaped Q4_K_M file's decode, 2 threads: a Zen 5 EPYC read two-pass
 *   rows 25-30% slower at 1-2 KiB than at 4 (8 like 4); a Sapphire Rapids-class Xeon, with half
 *   the bandwidth a thread, decoded 5-9% faster at 1.5-3 KiB than at 4 (8 like 4).
 * - ember_pf_batches: whether the 32-element types' kernels ask for each weight row ahead with
 *   2-16 rows of x, as with one (kernels.c's em_rows_of and em_rows_f32x). The Zen 5's hardware
 *   prefetch kept up with 2-4 rows of the avx512 path's (asking cost 5%); on the Xeon, SmolLM2's
 *   two and eight sequences on the avx2 path stepped 1.6-2x and 1.1-1.2x as fast asking, and on
 *   the avx512 path two and four 1.3-1.4x and 1.1-1.3x (Gemma 3's, its Q8_0 head: 1.5x, 1.3x).
 * - ember_pf_row_min: with one row of x, weight rows at least this long are asked for as the
 *   products go, shorter ones a whole row before them (kernels.c's em_kernel_prefetches). The
 *   Zen 5 read rows of 1.5 KiB and more faster so; on the Xeon every row did (one sequence,
 *   alternated twice: Gemma 3 63-64 -> 68-69 tok/s and Qwen 0.5B 37-38 -> 38-39 on the avx512
 *   path, 53-55 -> 68-74 and 30-32 -> 35-37 on avx2; SmolLM2 within the noise). */
EM_API int ember_kq_pf_ahead = 4096;
EM_API int ember_pf_batches = 0;
EM_API int ember_pf_row_min = 1536;

/* Whether the lane kernels (rows8.h; vnni.h in the avx512 copy) take a one-pass K type's x as
 * q8_K's int8 codes (kernels.c's em_lanes_x8), not int16; 0 only for benchmarks that compare */
EM_API int ember_lanes_x8 = 1;

/* 1 on Intel's CPUs, for the choices made in Python (prompt_attention.py's cell limit) */
EM_API int ember_cpu_intel = 0;

#if defined(__x86_64__) || defined(__i386__)
__attribute__((constructor)) static void em_pick_by_vendor(void) {
    unsigned a, vendor[3];
    if (__get_cpuid(0, &a, &vendor[0], &vendor[2], &vendor[1]) &&
        memcmp(vendor, "GenuineIntel", 12) == 0) {
        ember_kq_pf_ahead = 2048, ember_pf_batches = 1, ember_pf_row_min = 0;
        ember_cpu_intel = 1;
    }
}
#endif

typedef int (*em_matmul_fn)(int, const void *, const float *, float *, int64_t, int64_t, int64_t, int);
typedef int (*em_dequant_fn)(int, const void *, float *, int64_t, int64_t);

#define EM_DECLARE(isa)                                                                        \
    int ember_matmul_##isa(int, const void *, const float *, float *, int64_t, int64_t, int64_t, int); \
    int ember_dequant_##isa(int, const void *, float *, int64_t, int64_t);

EM_DECLARE(generic)
#ifdef EMBER_HAS_AVX2
EM_DECLARE(avx2)
#endif
#ifdef EMBER_HAS_AVXVNNI
EM_DECLARE(avxvnni)
#endif
#ifdef EMBER_HAS_AVX512
EM_DECLARE(avx512)
#endif
#ifdef EMBER_HAS_NEON
EM_DECLARE(neon)
#endif
#ifdef EMBER_HAS_AMX
EM_DECLARE(amx)
#endif
#ifdef EMBER_HAS_NEONDOT
EM_DECLARE(neondot)
#endif

EM_API int ember_isa_compiled(int isa) {
    switch (isa) {
    case 0: return 1;
#ifdef EMBER_HAS_AVX2
    case 1: return 1;
#endif
#ifdef EMBER_HAS_AVXVNNI
    case 2: return 1;
#endif
#ifdef EMBER_HAS_AVX512
    case 3: return 1;
#endif
#ifdef EMBER_HAS_NEON
    case 4: return 1;
#endif
#ifdef EMBER_HAS_AMX
    case 5: return 1;
#endif
#ifdef EMBER_HAS_NEONDOT
    case 6: return 1;
#endif
    default: return 0;
    }
}

EM_API int ember_cpu_supports(int isa) {
    if (isa == 0) return 1;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    const int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                     __builtin_cpu_supports("f16c");
    if (isa == 1) return avx2;
    if (isa == 2) return avx2 && em_has_avxvnni();
    const int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
    if (isa == 3) return avx512;
    if (isa == 5) return avx512 && em_has_amx_int8() && ember_amx_permitted();
#elif defined(__aarch64__)
    if (isa == 4) return 1; /* Advanced SIMD is part of every AArch64 CPU */
    if (isa == 6) return em_has_dotprod();
#endif
    return 0;
}

/* The CPU's features that matter here, space-separated (for the system info line). */
EM_API const char *ember_cpu_features(void) {
    static char text[160];
    text[0] = 0;
#if defined(__x86_64__) || defined(__i386__)
    static const char *names[] = {"avx", "avx2", "fma", "f16c", "avxvnni", "avx512f",
                                  "avx512bw", "avx512vl", "avx512vnni", "amx-int8"};
    __builtin_cpu_init();
    const int has[] = {__builtin_cpu_supports("avx"), __builtin_cpu_supports("avx2"),
                       __builtin_cpu_supports("fma"), __builtin_cpu_supports("f16c"),
                       em_has_avxvnni(),
                       __builtin_cpu_supports("avx512f"), __builtin_cpu_supports("avx512bw"),
                       __builtin_cpu_supports("avx512vl"), __builtin_cpu_supports("avx512vnni"),
                       em_has_amx_int8()};
    for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
        if (has[i]) {
            if (text[0]) strcat(text, " ");
            strcat(text, names[i]);
        }
#elif defined(__aarch64__)
    strcpy(text, em_has_dotprod() ? "neon dotprod" : "neon");
#endif
    return text;
}

/* The best ISA compiled in that this CPU runs. */
EM_API int ember_best_isa(void) {
    for (int isa = 6; isa > 0; isa--)
        if (ember_isa_compiled(isa) && ember_cpu_supports(isa)) return isa;
    return 0;
}

static em_matmul_fn em_matmul_of(int isa) {
    switch (isa) {
#ifdef EMBER_HAS_AVX2
    case 1: return ember_matmul_avx2;
#endif
#ifdef EMBER_HAS_AVXVNNI
    case 2: return ember_matmul_avxvnni;
#endif
#ifdef EMBER_HAS_AVX512
    case 3: return ember_matmul_avx512;
#endif
#ifdef EMBER_HAS_NEON
    case 4: return ember_matmul_neon;
#endif
#ifdef EMBER_HAS_AMX
    case 5: return ember_matmul_amx;
#endif
#ifdef EMBER_HAS_NEONDOT
    case 6: return ember_matmul_neondot;
#endif
    default: return ember_matmul_generic;
    }
}

static em_dequant_fn em_dequant_of(int isa) {
    switch (isa) {
#ifdef EMBER_HAS_AVX2
    case 1: return ember_dequant_avx2;
#endif
#ifdef EMBER_HAS_AVXVNNI
    case 2: return ember_dequant_avxvnni;
#endif
#ifdef EMBER_HAS_AVX512
    case 3: return ember_dequant_avx512;
#endif
#ifdef EMBER_HAS_NEON
    case 4: return ember_dequant_neon;
#endif
#ifdef EMBER_HAS_AMX
    case 5: return ember_dequant_amx;
#endif
#ifdef EMBER_HAS_NEONDOT
    case 6: return ember_dequant_neondot;
#endif
    default: return ember_dequant_generic;
    }
}

/* For C callers: the best ISA's kernels (Ember's Python side binds the suffixed names). */
EM_API int ember_matmul(int type, const void *w, const float *x, float *y, int64_t M, int64_t N,
                        int64_t K, int passes) {
    return em_matmul_of(ember_best_isa())(type, w, x, y, M, N, K, passes);
}

EM_API int ember_dequant(int type, const void *w, float *out, int64_t rows, int64_t K) {
    return em_dequant_of(ember_best_isa())(type, w, out, rows, K);
}
