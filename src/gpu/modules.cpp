/* src/gpu/modules.cpp - the modules compiled for one GPU, their tiles, and kernel launch. */

/* The most 16-byte chunks of a row a thread of a row-wise norm keeps in registers (NORM_SLOTS in the kernels), and
 * the threads a norm over a row of `chunks` such chunks takes: one a chunk, up to 1024 (n_embd <= 2 * 8192). */
static const int dllm__norm_slots = 2;
static unsigned dllm__norm_threads(int chunks) {
    return (unsigned)std::min(1024, std::max(32, (chunks + 31) / 32 * 32));
}

/* The modules dllm compiles for one GPU and one head dimension. */
/* Every module starts with the common helpers and the host/kernel contract. */
static std::string dllm__src_prelude() { return std::string(dllm__src_common) + dllm__src_contract(); }

static dllm__jit_request dllm__module_rowwise(const dllm__arch &arch) {
    const std::string slots = dllm__format("#define NORM_SLOTS %d\n", dllm__norm_slots);
    return {"dllm_rowwise",
            dllm__src_prelude() +
                DLLM__ROWWISE_KERNELS(DLLM__KERNEL_DECLARE) DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_DECLARE) + slots +
                dllm__src_rows_common + dllm__src_rowwise + dllm__src_e4m3 + dllm__src_fp8,
            {DLLM__ROWWISE_KERNELS(DLLM__KERNEL_NAME) DLLM__FP8_QUANT_KERNELS(DLLM__KERNEL_NAME)},
            arch.target};
}

/* [SoloQ] The formats' constants as kernel source, printed from the CPU's tables (section 9b) so that both sides hold
 * the same numbers: the format numbers, the INT4 step, the Lloyd-Max thresholds and INT8 levels, the E8P constants and
 * its 256 abs patterns and 12 x 12 W_int table (constant memory: the encoder walks them in lockstep). */
static std::string dllm__src_soloq_tables() {
    std::string s = dllm__format("enum { Q4_NVFP4 = %d, Q4_INT4 = %d, Q4_LLOYD = %d, Q4_E8P = %d, Q4_RTN = %d };\n",
                                 DLLM__Q4_NVFP4, DLLM__Q4_INT4, DLLM__Q4_LLOYD, DLLM__Q4_E8P, DLLM__Q4_RTN);
    s += dllm__format("#define SOLOQ_SEGMENT %d\n#define SOLOQ_QUANTIZE_THREADS %d\n", dllm__soloq_segment,
                      dllm__soloq_quantize_threads);
    s += dllm__format(
        "#define INT4_STEP %af\n#define LLOYD_KAPPA %af\n#define E8P_SCALE %af\n#define E8P_RESID %af\n"
        "#define E8P_ENC_SCALE %af\n",
        dllm__int4_step, dllm__lloyd4_kappa, dllm__e8p_scale, dllm__e8p_resid, dllm__e8p_scale * dllm__e8p_kappa);
    s += "__constant__ float LLOYD_T[7] = {";
    for (float t : dllm__lloyd4_thresholds) s += dllm__format("%af, ", t);
    s += "};\n__constant__ int LLOYD_INT[8] = {";
    for (int v : dllm__lloyd4_int) s += dllm__format("%d, ", v);
    s += "};\n__constant__ unsigned char E8P_ABS[2048] = {";
    for (int i = 0; i < 2048; i++) s += dllm__format("%d,", dllm__e8p_abs(i / 8)[i % 8]);
    s += "};\n__constant__ signed char E8P_INT[144] = {";
    for (int i = 0; i < 144; i++) s += dllm__format("%d,", dllm__e8p_int(2 * (i / 12) - 11, 2 * (i % 12) - 11));
    s += "};\n";
    // twin: dllm__nvfp4_s_enc
    s += "__device__ __forceinline__ float nvfp4_s_enc(float amax) {\n"
         "    const float s = fminf(__fdiv_rn(2688.0f, amax), 3.402823466e38f);\n"
         "    return amax > 0.f && s > 0.f ? s : 1.0f;\n}\n";
    return s;
}

static dllm__jit_request dllm__module_soloq(const dllm__arch &arch) {
    return {"dllm_soloq",
            dllm__src_prelude() + DLLM__SOLOQ_KERNELS(DLLM__KERNEL_DECLARE) +
                dllm__format("#define NORM_SLOTS %d\n", dllm__norm_slots) + dllm__src_rows_common +
                dllm__src_soloq_tables() + dllm__src_e4m3 + dllm__src_soloq,
            {DLLM__SOLOQ_KERNELS(DLLM__KERNEL_NAME)},
            arch.target};
}

/* The FP8 GEMM a GPU runs: its table row's, or DLLM_TILES fp8_gemm's where this GPU can run that one
 * (so that an H200 can test the kernel Ada runs). A value it cannot run, or a misspelt one, is an error. */
static dllm_status dllm__fp8_gemm_for(const dllm__arch &a, dllm__fp8_gemm &out) {
    out = a.fp8;
    const char *v = dllm__env().fp8_gemm.c_str();
    if (!*v) return DLLM_OK;
    if (strcmp(v, "mma") == 0) {
        if (a.cc < 89)
            return dllm__fail(
                DLLM_ERR_UNSUPPORTED,
                "DLLM_TILES=fp8_gemm=mma: the FP8 mma.sync kernel needs compute capability 8.9 or newer, this GPU is "
                "sm_%d",
                a.cc);
        out = DLLM__FP8_MMA;
    } else if (strcmp(v, "cublaslt") == 0) {
        if (a.cc != 90)
            return dllm__fail(
                DLLM_ERR_UNSUPPORTED,
                "DLLM_TILES=fp8_gemm=cublaslt: cuBLASLt's block-scaled FP8 runs on sm_90 only, this GPU is sm_%d",
                a.cc);
        out = DLLM__FP8_CUBLASLT_BLOCK;
    } else {
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "DLLM_TILES=fp8_gemm=%s: expected mma or cublaslt (or unset: the GPU's default)", v);
    }
    return DLLM_OK;
}

static std::string dllm__fp8_gemm_kernel_name(const dllm__fp8_tile &t) {
    return dllm__format("fp8_gemm<%d,%d,%d,%d,%d>", t.bm, t.bn, t.wm, t.wn, t.stages);
}

static size_t dllm__fp8_gemm_smem(const dllm__fp8_tile &t) { return (size_t)t.stages * (t.bm + t.bn) * 128; }

/* Both tiles of fp8_gemm; compiled only where the FP8 GEMM is DLLM__FP8_MMA. */
static dllm__jit_request dllm__module_fp8_gemm(const dllm__arch &arch) {
    const dllm__fp8_tile &w = arch.fp8_wide, &n = arch.fp8_narrow;
    return {dllm__format("dllm_fp8_gemm_%dx%dw%dx%ds%d_%dx%dw%dx%ds%d", w.bm, w.bn, w.wm, w.wn, w.stages, n.bm, n.bn,
                         n.wm, n.wn, n.stages),
            dllm__src_prelude() + dllm__src_mma + dllm__src_fp8_gemm,
            {dllm__fp8_gemm_kernel_name(w), dllm__fp8_gemm_kernel_name(n)},
            arch.target};
}

/* [W4 GEMM] q4_gemm's lookup tables as kernel source, generated from section 9b's decoders so that the kernel and its
 * twin decode the same numbers: the E8P abs patterns (packed as q4_e8p_open reads them), W_int, UE4M3 and the
 * 16-entry tables of NVFP4's e2m1 and Lloyd-Max's levels, all as bf16 (exact: integers up to 127, e2m1 values,
 * UE4M3 values). */
static uint32_t dllm__q4_e8p_abs_entry(int index) {
    const uint8_t *h = dllm__e8p_abs(index);
    uint32_t entry = 0, sum_half = 0;
    for (int i = 0; i < 8; i++) entry |= (uint32_t)((h[i] - 1) / 2) << (2 * i), sum_half += h[i];
    return entry | ((sum_half / 2) & 1) << 16;
}

static std::string dllm__src_q4_tables() {
    auto list = [](const char *decl, int n, const std::function<uint32_t(int)> &at) {
        std::string out = dllm__format("__device__ const %s = {", decl);
        for (int i = 0; i < n; i++) out += dllm__format("%s0x%x", i ? (i % 16 ? "," : ",\n") : "", (unsigned)at(i));
        return out + "};\n";
    };
    return list("u32 q4_e8p_abs_table[256]", 256, dllm__q4_e8p_abs_entry) +
           list("unsigned short q4_e8p_wint_table[144]", 144,
                [](int i) {
                    return (uint32_t)dllm__f32_to_bf16((float)dllm__e8p_int(2 * (i / 12) - 11, 2 * (i % 12) - 11));
                }) +
           list("unsigned short q4_e4m3_table[256]", 256,
                [](int c) { return (uint32_t)dllm__f32_to_bf16(dllm__e4m3_table()[c]); }) +
           list("unsigned short q4_e2m1_table[16]", 16,
                [](int c) { return (uint32_t)dllm__f32_to_bf16(dllm__e2m1_to_f32((uint8_t)c)); }) +
           list("unsigned short q4_lloyd_table[16]", 16, [](int c) {
               return (uint32_t)dllm__f32_to_bf16((float)(c & 8 ? -dllm__lloyd4_int[c & 7] : dllm__lloyd4_int[c & 7]));
           });
}

/* The W4 GEMM module: every format's entry point and the split-K reduction, with its tile constants and tables. */
static dllm__jit_request dllm__module_q4_gemm(const dllm__arch &arch) {
    const std::string tile =
        dllm__format("#define Q4_THREADS %d\n#define Q4_WT %d\n#define Q4_MT %d\n#define Q4_KC %d\n#define Q4_BN %d\n"
                     "#define Q4_STAGES %d\n#define Q4_STAGES_M32 %d\n",
                     dllm__q4_threads, dllm__q4_wt, dllm__q4_max_rows / 8, dllm__q4_kc, dllm__q4_bn, dllm__q4_stages,
                     dllm__q4_stages_m32);
    return {
        "dllm_q4_gemm",
            dllm__src_prelude() +
                DLLM__XSTR(struct q4_gemm_args{DLLM__Q4_GEMM_ARGS_FIELDS(DLLM__FIELD)};) "\n" DLLM__Q4_GEMM_KERNELS(
                    DLLM__KERNEL_DECLARE) +
                tile + dllm__src_q4_tables() + dllm__src_q4_dequant + dllm__src_q4_gemm,
            {DLLM__Q4_GEMM_KERNELS(DLLM__KERNEL_NAME)}, arch.target
    };
}

/* Shared memory of gemm_wg with a ring of `stages` and tiles bn wide: the ring, the consumers' staging buffers, the
 * slack that aligns them to 1024 bytes, and the full and empty mbarriers. */
static size_t dllm__gemm_wg_smem_of(int stages, int bn) {
    return (size_t)stages * (128 + bn) * 128 + 2 * 16384 + 1024 + 16 * stages;
}

/* gemm_wg's ring for tiles bn wide (256, 128 or 64): the table's for 256 columns (4 stages of 48 KB); for the narrower
 * ones the deepest ring that fits a CTA's 227 KB (128: 6 stages of 32 KB, the same 192 KB of k-steps in flight; 64: 8
 * of 24 KB). 0 where the table has no gemm_wg. */
static int dllm__gemm_wg_stages(const dllm__arch &a, int bn) {
    int stages = a.gemm_wg_stages;
    if (stages && bn != 256)
        while (dllm__gemm_wg_smem_of(stages + 1, bn) <= 227 * 1024) stages++;
    return stages;
}

static std::string dllm__gemm_wg_name(const dllm__arch &a, int bn) {
    return dllm__format("gemm_wg<%d,%d>", dllm__gemm_wg_stages(a, bn), bn);
}
static size_t dllm__gemm_wg_smem(const dllm__arch &a, int bn) {
    return dllm__gemm_wg_smem_of(dllm__gemm_wg_stages(a, bn), bn);
}

/* gemm_wg's module for tiles bn wide (sm_90a, where the table has it). */
static dllm__jit_request dllm__module_gemm_wg(const dllm__arch &arch, int bn) {
    return {dllm__format("dllm_gemm_wg_n%d_s%d", bn, dllm__gemm_wg_stages(arch, bn)),
            dllm__src_prelude() + dllm__src_mma + dllm__src_hopper + dllm__src_gemm_wg,
            {dllm__gemm_wg_name(arch, bn)},
            arch.target};
}

static dllm__jit_request dllm__module_sampler(const dllm__arch &arch) {
    return {"dllm_sampler",
            dllm__src_prelude() + DLLM__SAMPLER_KERNELS(DLLM__KERNEL_DECLARE) + dllm__src_sampler,
            {DLLM__SAMPLER_KERNELS(DLLM__KERNEL_NAME)},
            arch.target};
}

/* The table's attention tiles are those of head dims 64 and 128; this is the arch a model of head dim hd runs
 * (dllm__gpu_backend::init keeps it as its arch_). Any multiple of 8 up to 128 runs the table's tiles on
 * round_up(hd, 16) columns (hd_pad in the kernel). Above 128 the output accumulators alone take fa_mt * hd / 2
 * registers a thread (256 at hd 256 with the sm_90 row's two m16 tiles a warp: spills), so one m16 tile a warp, at
 * most 64 query rows a CTA, 32-key tiles in a 2-slot ring: at hd 256 that is 99 KB of shared memory, sm_86 and
 * sm_89's opt-in limit; the DLLM_TILES fa_* overrides do not apply there. flash_attn_wg is built for 64 and 128
 * only. */
static dllm__arch dllm__attn_tiles(dllm__arch a, int hd) {
    if (hd != 64 && hd != 128) a.fa_wg_bc = 0;
    if (hd > 128) {
        a.fa_mt = 1;
        a.fa_br = std::min(a.fa_br, 64);
        a.fa_bc = 32;
        a.fa_stages = 2;
    }
    return a;
}

/* flash_attn's head dims: multiples of 8 (rope_qkv's quads of pairs, 16-byte copies) up to 256. */
static bool dllm__attn_supports(int hd) { return hd >= 8 && hd <= 256 && hd % 8 == 0; }

static std::string dllm__attn_kernel_name(int hd, const dllm__arch &a) {
    return dllm__format("flash_attn<%d,%d,%d,%d,%d>", hd, a.fa_br, a.fa_bc, a.fa_mt, a.fa_stages);
}

static int dllm__attn_threads(const dllm__arch &a) { return a.fa_br * 2 / a.fa_mt; }

/* flash_attn's varlen instantiation (a batched forward's attention: per-sequence row ranges). */
static std::string dllm__attn_varlen_name(int hd, const dllm__arch &a) {
    return dllm__format("flash_attn<%d,%d,%d,%d,%d,true>", hd, a.fa_br, a.fa_bc, a.fa_mt, a.fa_stages);
}

static std::string dllm__attn_combine_name(int hd, bool varlen = false) {
    return dllm__format(varlen ? "attn_combine<%d,true>" : "attn_combine<%d>", hd);
}

static std::string dllm__attn_wide_name(int hd, const dllm__arch &a) {
    return dllm__format("flash_attn_wg<%d,%d,%d>", hd, a.fa_wg_bc, a.fa_wg_stages);
}

static dllm__jit_request dllm__module_attention(const dllm__arch &arch, int head_dim) {
    dllm__jit_request rq = {dllm__format("dllm_attn_hd%d_br%d_bc%d_mt%d_s%d_wg%d_ws%d", head_dim, arch.fa_br,
                                         arch.fa_bc, arch.fa_mt, arch.fa_stages, arch.fa_wg_bc, arch.fa_wg_stages),
                            dllm__src_prelude() + dllm__src_mma + dllm__src_attention,
                            {dllm__attn_kernel_name(head_dim, arch), dllm__attn_combine_name(head_dim)},
                            arch.target};
    if (arch.fa_wg_bc) {
        rq.source += std::string(dllm__src_hopper) + dllm__src_attention_wgmma;
        rq.kernels.push_back(dllm__attn_wide_name(head_dim, arch));
    }
    return rq;
}

/* The varlen flash_attn alone, in a module of its own: compiled (or read from the disk cache) by the first batched
 * forward, so that contexts that never batch pay nothing for it. */
/* [batch] [dual cache] [prefix cache] kv_scatter_rows, alone in its module: compiled only when a batch has a K/V
 * cache. */
static dllm__jit_request dllm__module_kv_scatter(const dllm__arch &arch) {
    return {"dllm_kv_scatter",
            dllm__src_prelude() + DLLM__BATCH_KV_KERNELS(DLLM__KERNEL_DECLARE) + dllm__src_kv_scatter,
            {DLLM__BATCH_KV_KERNELS(DLLM__KERNEL_NAME)},
            arch.target};
}

/* [MoE] LLaDA2's kernels (dllm__src_moe), loaded by a LLaDA2 context only; the quantised grouped GEMMs dequantise as
 * q4_gemm does (its tables and q4_dequant) and copy the rows with mma.cuh's cp.async. */
static dllm__jit_request dllm__module_moe(const dllm__arch &arch) {
    return {"dllm_moe",
            dllm__src_prelude() + DLLM__XSTR(struct moe_gemm_args{DLLM__MOE_GEMM_ARGS_FIELDS(DLLM__FIELD)};) "\n" +
                dllm__format("#define MOE_MAX_EXPERTS %d\n#define MOE_MAX_GROUPS %d\n#define MOE_TILE_ROWS %d\n"
                             "#define NORM_SLOTS %d\n#define Q4_THREADS %d\n",
                             dllm__moe_max_experts, dllm__moe_max_groups, dllm__moe_tile_rows, dllm__norm_slots,
                             dllm__moe_threads) +
                DLLM__MOE_KERNELS(DLLM__KERNEL_DECLARE) + dllm__src_rows_common + dllm__src_mma +
                dllm__src_q4_tables() + dllm__src_q4_dequant + dllm__src_moe,
            {DLLM__MOE_KERNELS(DLLM__KERNEL_NAME)},
            arch.target};
}

/* [batch] The varlen attention's tiles for short query runs (a K/V-cache step's block of 32 rows): 32 query rows a CTA,
 * one m16 tile a warp (2 warps), the table's key tiles and ring. With the table's 128 rows a CTA (4 warps of 32 rows)
 * a 32-row block leaves one warp of four live, and at 3 CTAs an SM a batch-16 step's 512 CTAs take two waves: the
 * H100 spent 136 us a layer there (4.4 of the step's 17.7 ms) against ~90 us to read its 268 MB of K/V. The short
 * tiles fit 5 CTAs an SM, so the 512 go in one wave (H200: 105 us a layer, the step 17.28 ms against 17.46 with the
 * table's tiles); but a CTA of them takes longer, so where the table's tiles already fit in one wave they win (H200,
 * batch 1: 60 us a layer against ~40). Hence the rule of dllm__attn_varlen_short. A row's bits do not depend on the
 * tile: each m16 tile's scores, softmax and output are the same instructions over the same key tiles in the same order
 * whichever warp and CTA hold it, and key tiles past a tile's last visible key change no bit
 * (gpu_batch.varlen_attention_equals_each_sequence_alone and gpu_bd_batch.masked_varlen_attention_* compare both with
 * the solo kernel). So the choice may follow the batch's shape without breaking batch invariance. */
static dllm__arch dllm__attn_short_tiles(dllm__arch a) {
    a.fa_br = 32, a.fa_mt = 1;
    return a;
}
static const int dllm__attn_short_rows = 64;  // the longest run the short tiles take

static dllm__jit_request dllm__module_attention_varlen(const dllm__arch &arch, int head_dim) {
    dllm__jit_request rq = {dllm__format("dllm_attn_varlen_hd%d_br%d_bc%d_mt%d_s%d", head_dim, arch.fa_br, arch.fa_bc,
                                         arch.fa_mt, arch.fa_stages),
                            dllm__src_prelude() + dllm__src_mma + dllm__src_attention,
                            {dllm__attn_varlen_name(head_dim, arch), dllm__attn_combine_name(head_dim, true)},
                            arch.target};
    const std::string short_name = dllm__attn_varlen_name(head_dim, dllm__attn_short_tiles(arch));
    if (short_name != rq.kernels[0]) rq.kernels.push_back(short_name);  // last: dllm__gpu_backend::load_varlen
    return rq;
}

/* Shared memory of flash_attn: the Q tile and the ring of K and V tiles, rows of round_up(hd, 16) columns (hd_pad)
 * padded by 8 (bank spread). */
static size_t dllm__attn_smem(int hd, const dllm__arch &a) {
    return (size_t)(a.fa_br + 2 * a.fa_stages * a.fa_bc) * ((hd + 15) / 16 * 16 + 8) * 2;
}

/* [batch] The varlen attention's tiles: the short ones where every run is short (max_rows) and the table's tiles would
 * not fit the SMs in one wave, at the CTAs an SM holds by shared memory (the runtime reserves 1 KB a CTA). */
static bool dllm__attn_varlen_short(const dllm__arch &arch, int head_dim, int n_head, int batch, int max_rows,
                                    int n_sms, int smem_per_sm) {
    const size_t table_smem = dllm__attn_smem(head_dim, arch) + 1024;
    const int64_t table_ctas = (int64_t)batch * n_head * ((max_rows + arch.fa_br - 1) / arch.fa_br);
    return max_rows <= dllm__attn_short_rows &&
           table_ctas > (int64_t)n_sms * (int64_t)((size_t)smem_per_sm / table_smem);
}

/* Shared memory of flash_attn_wg: 128 query rows and a ring of fa_wg_stages K and V tiles, unpadded (swizzled), the
 * slack that aligns them to 1024 bytes, and the mbarriers (Q, and K, V, empty per slot). */
static size_t dllm__attn_wide_smem(int hd, const dllm__arch &a) {
    return (size_t)(128 + 2 * a.fa_wg_stages * a.fa_wg_bc) * hd * 2 + 1024 + 8 * (1 + 3 * a.fa_wg_stages);
}

/* Split-KV (flash-decoding) for the short query sets of K/V-cache steps: 32 block rows make one query
 * tile per head, 32 CTAs on a 132-SM GPU, each streaming every key alone. Splitting the KV tiles gives
 * about two CTAs per SM, each with at least two tiles. Only ever asked for where every path that must
 * agree bit for bit takes the same split (the split changes the order of the softmax sums). */
static int dllm__attn_kv_splits(const dllm__arch &a, int q_rows, int seq, int heads_x_batch, int n_sms) {
    const int ctas = (q_rows + a.fa_br - 1) / a.fa_br * heads_x_batch, tiles = (seq + a.fa_bc - 1) / a.fa_bc;
    if (ctas >= n_sms) return 1;
    return std::max(1, std::min(tiles / 2, a.fa_kv_ctas_per_sm * n_sms / ctas));
}

/* The largest head dim whose varlen attention splits keys (above it the kernel has no register left for a split
 * index); a solo forward under a K/V cache does not split above it either, so that both agree. */
static const int dllm__attn_varlen_split_max_hd = 128;

/* Bytes of split-KV partial state any dllm__attn_kv_splits choice on n_sms SMs can need. */
static size_t dllm__attn_partial_bound(const dllm__arch &a, int hd, int n_sms) {
    return (size_t)a.fa_kv_ctas_per_sm * n_sms * a.fa_br * (hd + 2) * 4;
}

/* The attention kernels of one module: flash_attn, for split-KV the combine, and on sm_90a flash_attn_wg. */
struct dllm__attn_tensor_maps;
struct dllm__attn_kernels {
    dllm__kernel<void(attn_args)> attn, combine;
    dllm__kernel<void(attn_args, dllm__attn_tensor_maps)> wide;
};

/* The kernels of a loaded attention module, with the shared memory they need granted. */
static dllm_status dllm__attn_kernels_of(dllm__module &mod, const dllm__arch &arch, int hd, dllm__attn_kernels &k) {
    k.attn.fn = mod.kernels.at(dllm__attn_kernel_name(hd, arch)), k.attn.name = "flash_attn";
    k.combine.fn = mod.kernels.at(dllm__attn_combine_name(hd)), k.combine.name = "attn_combine";
    DLLM__CUDA(cudaFuncSetAttribute((const void *)k.attn.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dllm__attn_smem(hd, arch)));
    if (!arch.fa_wg_bc) return DLLM_OK;
    k.wide.fn = mod.kernels.at(dllm__attn_wide_name(hd, arch)), k.wide.name = "flash_attn_wg";
    DLLM__CUDA(cudaFuncSetAttribute((const void *)k.wide.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    (int)dllm__attn_wide_smem(hd, arch)));
    return DLLM_OK;
}

/* Whether kernels on the current device launch with programmatic dependent launch: sm_90 and newer, unless
 * DLLM_DEBUG_PLAIN=1. A 32-row block step is ~13 short kernels a layer; without it each one's launch waits for the
 * previous kernel to drain (see pdl_enter, which every kernel calls first). */
static bool dllm__pdl_on() {
    static std::atomic<int> cached[16];  // per device: 0 unknown, 1 off, 2 on
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 16) return false;
    int v = cached[dev].load();
    if (v == 0) {
        int major = 0;
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        v = major >= 9 && dllm__env().pdl ? 2 : 1;
        cached[dev].store(v);
    }
    return v == 2;
}

/* The grid of a row-wise kernel that gives each row `per_row` threads in blocks of `threads` (x) and walks the rows
 * in y (a kernel loops over rows past the grid's 65535 limit). */
static dim3 dllm__rows_grid(int n_rows, int per_row, int threads) {
    return dim3((unsigned)((per_row + threads - 1) / threads), (unsigned)std::max(1, std::min(n_rows, 65535)));
}

/* The grid of quantize_rows_e4m3 and swiglu_e4m3 over n_rows rows of k values, in CTAs of 128 threads (one 8-code
 * chunk each). */
static dim3 dllm__e4m3_rows_grid(int n_rows, int k) { return dllm__rows_grid(n_rows, (k + 127) / 128 * 16, 128); }

/* The launch attribute that groups a grid's CTAs in clusters of `ctas` along x. */
static cudaLaunchAttribute dllm__cluster_attr(unsigned ctas) {
    cudaLaunchAttribute a;
    a.id = cudaLaunchAttributeClusterDimension;
    a.val.clusterDim.x = ctas;
    a.val.clusterDim.y = a.val.clusterDim.z = 1;
    return a;
}

/* Launches a JIT kernel; args are pointers to the argument values, as for cudaLaunchKernel (dllm__kernel::launch
 * builds them from typed arguments). */
static dllm_status dllm__launch_raw(cudaKernel_t k, const dllm__grid &g, cudaStream_t stream, void **args,
                                    const char *name) {
    cudaLaunchAttribute attrs[2];
    unsigned n = 0;
    if (g.cluster > 1) attrs[n++] = dllm__cluster_attr(g.cluster);
    if (dllm__pdl_on()) {
        attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attrs[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = g.grid;
    cfg.blockDim = g.block;
    cfg.dynamicSmemBytes = g.smem;
    cfg.stream = stream;
    cfg.attrs = attrs;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelExC(&cfg, (const void *)k, args);
    if (e != cudaSuccess) return dllm__cuda_fail(e, name);
    return DLLM_OK;
}
