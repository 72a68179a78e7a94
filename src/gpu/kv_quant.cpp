/* src/gpu/kv_quant.cpp - the quantised K/V cache on the GPU (kvq, kvq_flash). */

/* [KV quant] The module (9b's SoloQ device functions with dllm__src_kvq, the 2-bit levels printed from 9c's) and the
 * rotations, once; the codes of `rows` rows zeroed (9c: rows below the sinks keep codes 0). */
static std::string dllm__src_kvq_module() {
    return dllm__src_prelude() +
           DLLM__XSTR(struct kvq_args{DLLM__KVQ_ARGS_FIELDS(DLLM__FIELD)};) "\n" DLLM__XSTR(
               struct kvq_item{DLLM__KVQ_ITEM_FIELDS(DLLM__FIELD)};) "\n" DLLM__XSTR(struct kvq_batch_args{
               DLLM__KVQ_BATCH_ARGS_FIELDS(DLLM__FIELD)};) "\n" DLLM__SOLOQ_KERNELS(
               DLLM__KERNEL_DECLARE) DLLM__KVQ_KERNELS(DLLM__KERNEL_DECLARE) +
           dllm__format("#define NORM_SLOTS %d\n", dllm__norm_slots) + dllm__src_rows_common +
           dllm__src_soloq_tables() +
           dllm__format("#define LLOYD2_THRESHOLD %af\n__constant__ float LLOYD2_LEVELS[2] = {%af, %af};\n",
                        dllm__lloyd2_threshold, dllm__lloyd2_levels[0], dllm__lloyd2_levels[1]) +
           dllm__src_e4m3 + dllm__src_soloq + dllm__src_warp_softmax + dllm__src_kvq;
}
static dllm__jit_request dllm__module_kvq(const dllm__arch &arch) {
    return {"dllm_kvq", dllm__src_kvq_module(), {DLLM__KVQ_KERNELS(DLLM__KERNEL_NAME)}, arch.target};
}

/* [KV quant] kvq_flash's tiles (kvq_tc): keys per tile (64; 32 past head dim 128, where a tile's rows are twice
 * as wide), the key groups whose pairs a stage holds (the 7B shape's tile of 64 keys spans 2 groups of 32; a tile
 * spanning more reads the rest from global memory), warps at most (one m16 tile of query rows each; 14 hold the 7B
 * shape's 7 x 32 rows of a kv head, at 128 registers a thread: 4 warps share a sub-partition's 16K registers; 8 at
 * larger head dims, whose 128 output registers a thread need the 255 of 256 threads). */
static int dllm__kvq_tc_bc(int hd) { return hd > 128 ? 32 : 64; }
static const int dllm__kvq_tc_pair_groups = 4;
static int dllm__kvq_tc_max_warps(int hd) { return hd > 128 ? 8 : 14; }
static size_t dllm__kvq_tc_stage_bytes(int hd) {
    return (size_t)dllm__kvq_tc_bc(hd) * hd + (size_t)dllm__kvq_tc_pair_groups * hd * 4 +
           (size_t)dllm__kvq_tc_bc(hd) * 4;
}
/* Dynamic shared memory of a CTA of `warps` warps: the query rows, two decoded K and V tiles each (one multiplied while
 * the other is decoded), a tile's pairs in fp32 and its keys' groups, two stages of raw codes and pairs. */
static size_t dllm__kvq_tc_smem(int hd, int warps) {
    return (size_t)(warps * 16 + 4 * dllm__kvq_tc_bc(hd)) * (hd + 8) * 2 +
           (size_t)(dllm__kvq_tc_pair_groups * hd + dllm__kvq_tc_bc(hd)) * 8 + (size_t)dllm__kvq_tc_bc(hd) * 4 +
           2 * dllm__kvq_tc_stage_bytes(hd);
}
static const int dllm__kvq_tc_chunk_rows =
    128;  // query rows a launch at most (a prefill's rows go in launches of these)

/* The module of one head dim (a multiple of 16 up to 256: the mma's k16; checked by dllm__kvq_tc_plan_for): the kvq
 * module's source, the tensor-core plumbing and flash_attn's online softmax, then dllm__src_kvq_tc. */
static dllm__jit_request dllm__module_kvq_tc(const dllm__arch &arch, int hd) {
    return {
        dllm__format("dllm_kvq_tc_hd%d", hd),
        dllm__src_kvq_module() + DLLM__KVQ_TC_KERNELS(DLLM__KERNEL_DECLARE) +
            dllm__format(
                "#define KVQ_HD %d\n#define KVQ_TC_BC %d\n#define KVQ_TC_PG %d\n#define KVQ_TC_THREADS %d\n"
                "#define KVQ_TC_STAGE %zu\n",
                hd, dllm__kvq_tc_bc(hd), dllm__kvq_tc_pair_groups, dllm__kvq_tc_max_warps(hd) * 32,
                dllm__kvq_tc_stage_bytes(hd)) +
            dllm__src_mma + dllm__src_attention + dllm__src_kvq_tc,
        {DLLM__KVQ_TC_KERNELS(DLLM__KERNEL_NAME)},
        arch.target};
}

/* p's CTAs of `warps` warps over a kv head's group_rows query rows: their shared memory and row tiles. */
static void dllm__kvq_tc_set_warps(dllm__kvq_tc_plan &p, int hd, int group_rows, int warps) {
    p.warps = warps, p.smem = dllm__kvq_tc_smem(hd, warps), p.q_tiles = (group_rows + warps * 16 - 1) / (warps * 16);
}
/* p's keys in splits of split_keys (dllm__kvq_tc_n_splits). */
static void dllm__kvq_tc_set_splits(dllm__kvq_tc_plan &p, int split_keys, int n_keys, int n_committed, int n_sink) {
    p.split_keys = split_keys, p.n_splits = dllm__kvq_tc_n_splits(n_keys, n_committed, n_sink, split_keys);
}
/* Bytes of split states plan p's launch over q_rows rows of n_head heads writes. */
static size_t dllm__kvq_tc_partial_bytes(const dllm__kvq_tc_plan &p, int n_head, int q_rows, int hd) {
    return (size_t)p.n_splits * n_head * q_rows * (hd + 2) * 4;
}

/* The plan for q_rows query rows over n_keys keys: every row of a kv head's group in one CTA where the shared memory
 * allows, then the keys split so that the grid is about one CTA per SM (a CTA of 14 warps holds a whole SM's
 * registers at head dim 128). A head dim kvq_flash does not take is DLLM_ERR_UNSUPPORTED (kvq_attention takes it). */
static dllm_status dllm__kvq_tc_plan_for(int hd, int n_head, int n_kv, int q_rows, int n_keys, int n_committed,
                                         int n_sink, int n_sms, int smem_optin, dllm__kvq_tc_plan &p) {
    if (hd % 16 || hd > 256 || n_kv <= 0 || n_head % n_kv)
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "kvq_tc: the tensor-core attention takes head dims that are multiples of 16 up to 256 and whole GQA "
            "groups (head dim %d, %d heads over %d kv heads); kvq_attention serves the rest (DLLM_DEBUG_PLAIN=1 takes "
            "it everywhere)",
            hd, n_head, n_kv);
    const int rows = n_head / n_kv * q_rows, bc = dllm__kvq_tc_bc(hd);
    int warps = std::max(1, std::min(dllm__kvq_tc_max_warps(hd), (rows + 15) / 16));
    while (warps > 1 && dllm__kvq_tc_smem(hd, warps) > (size_t)smem_optin) warps--;
    dllm__kvq_tc_set_warps(p, hd, rows, warps);
    if (p.smem > (size_t)smem_optin)
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "kvq_tc: head dim %d needs %zu bytes of shared memory a block, the GPU allows %d; kvq_attention runs "
            "instead",
            hd, p.smem, smem_optin);
    const int target = std::max(1, n_sms / (n_kv * p.q_tiles));
    dllm__kvq_tc_set_splits(p, std::max(2 * bc, (std::max(1, (n_keys + target - 1) / target) + bc - 1) / bc * bc),
                            n_keys, n_committed, n_sink);
    return DLLM_OK;
}

/* Bytes of split states a launch of at most dllm__kvq_tc_chunk_rows rows can need: splits <= the plan's target + 6
 * (each of the three ranges adds at most one split to its share of the keys and one for its misaligned start). */
static size_t dllm__kvq_tc_partial_bound(int hd, int n_head, int n_kv, int n_sms, int smem_optin) {
    size_t most = 0;
    for (int rows = 1; rows <= dllm__kvq_tc_chunk_rows; rows++) {
        dllm__kvq_tc_plan p;
        if (dllm__kvq_tc_plan_for(hd, n_head, n_kv, rows, 1, 0, 0, n_sms, smem_optin, p) != DLLM_OK) return 0;
        const size_t splits = (size_t)std::max(1, n_sms / (n_kv * p.q_tiles)) + 6;
        most = std::max(most, splits * n_head * rows * (hd + 2) * 4);
    }
    return most;
}

/* [batch] The work of one layer's attention over the sequences' codes: one kvq_flash launch per CTA shape and one
 * combine under kvq_tc, or one kvq_attention launch. Each sequence's chunks and their CTAs are exactly those
 * kvq_attention launches for it alone (tc: kvq_flash's plan of each chunk of at most dllm__kvq_tc_chunk_rows rows, from
 * the sequence's own rows and keys; else kvq_attention's (row, head) warps), so each row's arithmetic, its splits and
 * their merge are those of the sequence alone. */
static dllm_status dllm__kvq_batch_work_of(bool tc, int hd, int n_head, int n_kv, int n_sink, int n_sms,
                                           int smem_optin, const std::vector<dllm__kvq_batch_seq> &seqs,
                                           dllm__kvq_batch_work &w) {
    w = dllm__kvq_batch_work();
    w.tc = tc;
    for (size_t s = 0; s < seqs.size(); s++) {
        const dllm__kvq_batch_seq &q = seqs[s];
        const int step = tc ? dllm__kvq_tc_chunk_rows : std::max(q.T, 1);
        for (int r0 = 0; r0 < q.T; r0 += step) {
            dllm__kvq_batch_chunk c;
            c.seq = (int)s, c.r0 = r0, c.rows = std::min(step, q.T - r0);
            if (tc) {
                DLLM__TRY(dllm__kvq_tc_plan_for(hd, n_head, n_kv, c.rows, q.n_keys, q.n_committed, n_sink, n_sms,
                                                smem_optin, c.plan));
                c.partial = w.partial_floats;
                w.partial_floats += dllm__kvq_tc_partial_bytes(c.plan, n_head, c.rows, hd) / 4;
            }
            w.chunks.push_back(c);
        }
    }
    for (size_t c = 0; tc && c < w.chunks.size(); c++) {  // the CTA shapes, in the order the chunks first take them
        bool seen = false;
        for (const dllm__kvq_batch_group &g : w.groups)
            seen = seen || (g.warps == w.chunks[c].plan.warps && g.q_tiles == w.chunks[c].plan.q_tiles);
        if (seen) continue;
        dllm__kvq_batch_group g;
        g.warps = w.chunks[c].plan.warps, g.q_tiles = w.chunks[c].plan.q_tiles, g.first = (int)w.items.size();
        g.smem = dllm__kvq_tc_smem(hd, g.warps);
        for (size_t d = c; d < w.chunks.size(); d++) {
            const dllm__kvq_batch_chunk &ch = w.chunks[d];
            if (ch.plan.warps != g.warps || ch.plan.q_tiles != g.q_tiles) continue;
            w.items.push_back({(int)d, 0});
            g.max_splits = std::max(g.max_splits, ch.plan.n_splits);
        }
        g.count = (int)w.items.size() - g.first;
        w.groups.push_back(g);
    }
    w.n_flash = (int)w.items.size();
    for (size_t c = 0; c < w.chunks.size(); c++)
        for (int i = 0; i < w.chunks[c].rows; i++) w.items.push_back({(int)c, i});
    return DLLM_OK;
}

static dllm_status dllm__kvq_tc_load(const dllm__arch &arch, int hd, int smem_optin, dllm__kvq_tc_kernels &k) {
    DLLM__TRY(dllm__jit_load(dllm__module_kvq_tc(arch, hd), k.module));
    dllm__bind(k, *k.module);
    k.hd = hd, k.smem_optin = smem_optin;
    const size_t most = std::min((size_t)smem_optin, dllm__kvq_tc_smem(hd, dllm__kvq_tc_max_warps(hd)));
    for (cudaKernel_t fn : {k.kvq_flash.fn, k.kvq_flash_batch.fn})
        DLLM__CUDA(cudaFuncSetAttribute((const void *)fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)most));
    return DLLM_OK;
}

/* kvq_flash then kvq_flash_combine for a's q_rows rows (at most dllm__kvq_tc_chunk_rows) under plan p; `partial` holds
 * partial_bytes (dllm__kvq_tc_partial_bound). */
static dllm_status dllm__kvq_tc_launch(const dllm__kvq_tc_kernels &k, kvq_args a, const dllm__kvq_tc_plan &p,
                                       float *partial, size_t partial_bytes, cudaStream_t s) {
    const size_t need = dllm__kvq_tc_partial_bytes(p, a.n_head, a.q_rows, a.hd);
    if (need > partial_bytes || a.hd != k.hd)
        return dllm__fail(
            DLLM_ERR_INTERNAL,
            "kvq_flash: %d splits of %d rows need %zu bytes of split states, %zu allocated (head dim %d, kernels for "
            "%d)",
            p.n_splits, a.q_rows, need, partial_bytes, a.hd, k.hd);
    a.split_keys = p.split_keys, a.partial = partial;
    DLLM__TRY(k.kvq_flash.launch(
        {dim3((unsigned)p.n_splits, (unsigned)a.n_kv, (unsigned)p.q_tiles), dim3((unsigned)p.warps * 32), p.smem}, s,
        a));
    return k.kvq_flash_combine.launch({dim3((unsigned)a.q_rows, (unsigned)a.n_head), dim3(32)}, s, a);
}

/* [KV quant] The module and the rotations on the device, once a context (kvq_begin, kvq_batch_reserve). */
dllm_status dllm__gpu_backend::kvq_load() {
    const dllm__config &c = model_.cfg;
    if (c.head_dim > 256)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "kv_quant on the GPU takes head dims up to 256, the model's is %d",
                          c.head_dim);
    if (!kv_codes_.kernels.module) {
        DLLM__TRY(dllm__jit_load(dllm__module_kvq(arch_), kv_codes_.kernels.module));
        dllm__bind(kv_codes_.kernels, *kv_codes_.kernels.module);
    }
    if (kvq_.soloq() && kv_codes_.rotations.empty()) {
        kv_codes_.rotations.resize(kvq_.rot.size());
        for (size_t l = 0; l < kvq_.rot.size(); l++)
            DLLM__TRY(dllm__rotation_upload(kvq_.rot[l], kv_codes_.rotations[l]));
    }
    return DLLM_OK;
}

/* A committed cache of `rows` rows (a generation's or a batch slot's): its codes fitted and zeroed (9c: rows below the
 * sinks keep codes 0), its V side and its sinks' bf16 rows fitted. The key pairs wait for the first commit's group. */
dllm_status dllm__gpu_backend::kvq_fit(dllm__dbuf &k_codes, dllm__dbuf &v_codes, dllm__dbuf &v_side, dllm__dbuf &sinks,
                                       int rows, int sink_rows) {
    const size_t codes = (size_t)kvq_.n_layer * rows * kvq_.row_bytes();
    DLLM__TRY(k_codes.fit(codes, "the quantised K/V cache"));
    DLLM__TRY(v_codes.fit(codes, "the quantised K/V cache"));
    DLLM__TRY(v_side.fit((size_t)kvq_.n_layer * rows * kvq_.n_kv * 4, "the quantised K/V cache"));
    DLLM__TRY(sinks.fit((size_t)kvq_.n_layer * sink_rows * 4 * kvq_.kvd, "the K/V cache's full-precision sinks"));
    DLLM__CUDA(cudaMemsetAsync(k_codes.ptr, 0, codes, stream_));
    DLLM__CUDA(cudaMemsetAsync(v_codes.ptr, 0, codes, stream_));
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::kvq_begin(int rows) {
    DLLM__TRY(kvq_load());
    kvq_.cap = rows, kvq_.group = 0, kv_codes_.sink_rows = std::min(kvq_.n_sink, rows);
    DLLM__TRY(
        kvq_fit(kv_codes_.k_codes, kv_codes_.v_codes, kv_codes_.v_side, kv_codes_.sinks, rows, kv_codes_.sink_rows));
    if (kv_codes_.keep_rows) kv_codes_.kept.assign((size_t)kvq_.n_layer * rows * 2 * kvq_.kvd, 0);
    kv_codes_.flash_on = false;
    return dllm__env().kvq_tc ? kvq_tc_begin() : DLLM_OK;
}

/* kvq_tc: kvq_flash's module for the model's head dim, once, and its split states sized for any launch. A head
 * dim it does not take keeps kvq_attention (a warning says why). */
dllm_status dllm__gpu_backend::kvq_tc_begin() {
    const dllm__config &c = model_.cfg;
    int smem_optin = 0;
    DLLM__CUDA(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
    dllm__kvq_tc_plan probe;
    if (dllm__kvq_tc_plan_for(c.head_dim, c.n_head, c.n_head_kv, 1, 1, 0, 0, n_sms_, smem_optin, probe) != DLLM_OK) {
        dllm__log(DLLM_LOG_INFO, "%s", dllm_last_error());  // kvq_attention runs: correct, slower
        return DLLM_OK;
    }
    if (!kv_codes_.flash.module) DLLM__TRY(dllm__kvq_tc_load(arch_, c.head_dim, smem_optin, kv_codes_.flash));
    DLLM__TRY(
        kv_codes_.flash_partial.fit(dllm__kvq_tc_partial_bound(c.head_dim, c.n_head, c.n_head_kv, n_sms_, smem_optin),
                                    "the split states of the tensor-core KV-quant attention (kvq_tc)"));
    kv_codes_.flash_on = true;
    return DLLM_OK;
}

/* The arguments of layer `layer`'s kernels over the cache `at`: its codes (9c's layout), sinks and forwarded rows,
 * settings and rotation. */
kvq_args dllm__gpu_backend::kvq_layer_args(const dllm__kvq_codes &at, size_t layer) const {
    const kvq_args none = {};
    kvq_args a = none;
    const int groups = at.group ? (at.capacity + at.group - 1) / at.group : 0;
    const size_t row_elems = (size_t)2 * kvq_.kvd, codes = layer * at.capacity * kvq_.row_bytes(),
                 side = layer * at.capacity * kvq_.n_kv;
    a.sinks = (const bf16_t *)at.sinks + layer * at.sink_rows * row_elems;
    a.fresh = (const bf16_t *)at.fresh;
    a.k_codes = (unsigned char *)at.k_codes + codes, a.v_codes = (unsigned char *)at.v_codes + codes;
    a.k_pairs = at.group ? (unsigned short *)at.k_pairs + layer * groups * kvq_.kvd * 2 : nullptr;
    a.v_pairs = kvq_.soloq() ? nullptr : (unsigned short *)at.v_side + 2 * side;
    a.v_scale = kvq_.soloq() ? (float *)at.v_side + side : nullptr;
    if (kvq_.soloq()) {
        const dllm__rotation_dev &r = kv_codes_.rotations[layer];
        a.perm = r.perm.as<int>(), a.signs = (const unsigned char *)r.signs.ptr, a.mixer = r.mixer.as<float>();
        a.rot_b = r.b, a.rot_k = r.k, a.rot_norm = r.norm;
    }
    a.n_kv = kvq_.n_kv, a.hd = kvq_.hd, a.bits = kvq_.bits, a.soloq = kvq_.soloq(), a.n_sink = kvq_.n_sink,
    a.group = at.group;
    return a;
}

/* Layer `layer`'s rows [row0, row0 + T) of the cache `at`, just forwarded into at.fresh, committed: quantised
 * (twin: dllm__kvq_commit's loop body, on the bf16 rows), those below the sinks copied as they are. The key groups were
 * checked by bd_forward (a batch: kvq_batch_prepare). */
dllm_status dllm__gpu_backend::kvq_commit(const dllm__kvq_codes &at, size_t layer, int row0, int T) {
    kvq_args a = kvq_layer_args(at, layer);
    a.row0 = row0, a.rows = T;
    const size_t row_bytes = (size_t)4 * kvq_.kvd;
    const int sink_end = std::min(row0 + T, at.sink_rows);
    if (row0 < sink_end)
        DLLM__CUDA(cudaMemcpyAsync((char *)a.sinks + (size_t)row0 * row_bytes, a.fresh,
                                   (size_t)(sink_end - row0) * row_bytes, cudaMemcpyDeviceToDevice, stream_));
    if (kv_codes_.keep_rows && at.k_codes == kv_codes_.k_codes.ptr)  // the solo cache's (tests)
        DLLM__TRY(kvq_keep(layer, row0, T));
    const unsigned key_threads = (unsigned)(T / at.group) * (unsigned)kvq_.row_bytes();
    DLLM__TRY(kv_codes_.kernels.kvq_commit_keys.launch({dim3((key_threads + 127) / 128), dim3(128)}, stream_, a));
    const int first = std::max(row0, kvq_.n_sink);
    if (first < row0 + T)
        DLLM__TRY(kv_codes_.kernels.kvq_commit_values.launch(
            {dim3((unsigned)(row0 + T - first), (unsigned)kvq_.n_kv), dim3(32)}, stream_, a));
    return DLLM_OK;
}

/* kvq_layer_args with the attention's: query rows q (outputs o; strides the forward's), n_keys keys of which
 * n_committed committed, the mask, the first query at sequence index pos0 (kvq_attention, kvq_batch_upload). */
kvq_args dllm__gpu_backend::kvq_attention_args(const dllm__kvq_codes &at, size_t layer, const bf16_t *q, bf16_t *o,
                                               int n_keys, int n_committed, int mask_block, int pos0) const {
    const dllm__config &c = model_.cfg;
    kvq_args a = kvq_layer_args(at, layer);
    a.q = q, a.o = o;
    a.q_stride = (c.n_head + 2 * c.n_head_kv) * c.head_dim, a.o_stride = c.n_head * c.head_dim, a.n_head = c.n_head;
    a.n_keys = n_keys, a.n_committed = n_committed, a.mask_block = mask_block, a.q_index0 = pos0,
    a.scale = 1.0f / sqrtf((float)c.head_dim);
    return a;
}

/* T query rows (q, their outputs o; strides the forward's) attending block-causally to the cache `at`'s n_committed
 * rows (quantised ones read from their codes) ++ at.fresh's rows, n_keys in all, the first query at sequence index
 * pos0: kvq_flash (the default, kvq_tc) in launches of at most dllm__kvq_tc_chunk_rows query rows; kvq_attention,
 * a warp per (query row, head), where kvq_flash cannot run or is switched off. Every launch's shape follows these
 * arguments only, so a batched sequence's attention is its own whatever else is in the batch. */
dllm_status dllm__gpu_backend::kvq_attention(const dllm__kvq_codes &at, size_t layer, const bf16_t *q, bf16_t *o,
                                             int T, int n_keys, int n_committed, int mask_block, int pos0) {
    const dllm__config &c = model_.cfg;
    const kvq_args a = kvq_attention_args(at, layer, q, o, n_keys, n_committed, mask_block, pos0);
    if (!kv_codes_.flash_on)
        return kv_codes_.kernels.kvq_attention.launch({dim3((unsigned)T, (unsigned)c.n_head), dim3(32)}, stream_, a);
    for (int r0 = 0; r0 < T; r0 += dllm__kvq_tc_chunk_rows) {
        kvq_args chunk = a;
        chunk.q += (size_t)r0 * a.q_stride, chunk.o += (size_t)r0 * a.o_stride, chunk.q_index0 = pos0 + r0;
        chunk.q_rows = std::min(dllm__kvq_tc_chunk_rows, T - r0);
        dllm__kvq_tc_plan p;
        DLLM__TRY(dllm__kvq_tc_plan_for(c.head_dim, c.n_head, c.n_head_kv, chunk.q_rows, n_keys, n_committed,
                                        kvq_.n_sink, n_sms_, kv_codes_.flash.smem_optin, p));
        DLLM__TRY(dllm__kvq_tc_launch(kv_codes_.flash, chunk, p, kv_codes_.flash_partial.as<float>(),
                                      kv_codes_.flash_partial.bytes, stream_));
    }
    return DLLM_OK;
}
