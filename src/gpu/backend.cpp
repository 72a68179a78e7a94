/* src/gpu/backend.cpp - the GPU backend: its state, set-up and buffers. */

// ---------------------------------------------------------------------------------------------------
// 16.4 The backend
// ---------------------------------------------------------------------------------------------------

/* [bd graphs] A block-diffusion step forward (16.4.3) replayed as a CUDA graph. A block runs many forwards of one shape
 * (only the block's ids change, and they reach the device by a copy before the replay), and the next block the same
 * shapes again over a longer committed cache (only kernel arguments change: the graph is updated in place). A graph is
 * held per slot: `slot` names what fixes its kernels, their grids and the arguments constant for a generation (kind,
 * rows, sub-block offset, mask, output rows, whether a committed cache exists: layer 0's attention path, the split-KV
 * count, the device token choice's rows and sampling); `baked` adds what changes from block to block (the committed
 * length and the block cache's rows, the sampled rows' position) and the device buffers the graph points into. */
struct dllm__graph_id {
    std::string slot, baked;
};
static dllm__graph_id dllm__bd_graph_keys(const dllm__bd_call &call, const dllm__bd_pick *pick, int n_committed,
                                          int block_rows, int kv_splits, const std::string &buffers) {
    dllm__graph_id id;
    id.slot = dllm__format("k%d T%d o%d m%d r%d-%d c%d s%d", (int)call.kind, call.T, call.offset, call.mask_block,
                           call.r0, call.r1, n_committed > 0, kv_splits);
    if (pick) {
        const dllm__sampling &s = pick->sampling;
        id.slot += dllm__format(" pick n%d l%d s%d %.17g %d %d %.17g %llu %d %d %d %d %d %.17g %.17g", pick->n,
                                pick->lrow0, pick->shift0, s.temperature, (int)s.remasking, (int)s.tempered_conf,
                                s.alg_temp, (unsigned long long)s.seed, (int)s.eos_logit_inf, (int)s.defer_eos_eot,
                                s.eos_id, s.eot_id, s.top_k, s.top_p, s.min_p);
    }
    id.baked = id.slot + dllm__format(" | n%d b%d p%d ", n_committed, block_rows, pick ? pick->pos0 : -1) + buffers;
    return id;
}

/* A forward replayed as a CUDA graph ([bd graphs], [batch graphs]): one executable graph per slot. What one forward of
 * a slot does: the slot's first forward runs eagerly (cuBLASLt's and the modules' one-time work stay outside any
 * capture), the next is captured and instantiated; later ones replay it when it baked in the same, else are captured
 * again and update it in place (re-instantiated where CUDA refuses the update). */
enum dllm__graph_action { DLLM__GRAPH_EAGER, DLLM__GRAPH_REPLAY, DLLM__GRAPH_UPDATE, DLLM__GRAPH_INSTANTIATE };
struct dllm__graph_slot {
    cudaGraphExec_t exec = nullptr;  // destroyed by its owner (dllm__gpu_backend)
    std::string baked;
    bool warmed = false;
    bool eager_only = false;  // a capture failed: the slot's forwards run eagerly (bd_replay warns once)
};
static dllm__graph_action dllm__graph_next(dllm__graph_slot &g, const dllm__graph_id &id) {
    if (!g.warmed || g.eager_only) {
        g.warmed = true;
        return DLLM__GRAPH_EAGER;
    }
    if (g.exec && g.baked == id.baked) return DLLM__GRAPH_REPLAY;
    const dllm__graph_action a = g.exec ? DLLM__GRAPH_UPDATE : DLLM__GRAPH_INSTANTIATE;
    g.baked = id.baked;  // what the capture about to run bakes in
    return a;
}
static const size_t dllm__graph_slots = 64;  // a context's captured forwards of one kind at most (all dropped past it)
/* A context's captured forwards of one kind: the slots by dllm__graph_id::slot, what each forward did and the updates
 * CUDA refused (the tests read both), and the once-a-context log lines. */
struct dllm__graph_set {
    const char *what;  // the kind of forward, for the log: "a batched forward"
    std::map<std::string, dllm__graph_slot> slots;
    int64_t counts[4] = {};  // forwards by dllm__graph_action
    int64_t refusals = 0;    // in-place updates CUDA refused (capture_graph)
    bool warned_eager = false, logged_refusal = false;
    explicit dllm__graph_set(const char *kind) : what(kind) {}
};

/* [batch] A run of consecutive rows of a batched forward whose sequences are all steps or all not (DLLM__ROWS_STEP). */
struct dllm__gemm_run {
    int r0, r1;
    bool step;
};
static std::vector<dllm__gemm_run> dllm__gemm_runs_of(const dllm__varlen_layout &v) {
    std::vector<dllm__gemm_run> runs;
    for (size_t i = 0; i + 1 < v.offsets.size(); i++) {
        const bool step = i < v.step.size() && v.step[i];
        if (!runs.empty() && runs.back().step == step)
            runs.back().r1 = v.offsets[i + 1];
        else
            runs.push_back({v.offsets[i], v.offsets[i + 1], step});
    }
    return runs;
}

/* [KV quant] Where one committed cache's codes are (kvq_layer_args): the solo generation's (kv_codes_, kvq_codes_solo)
 * or a batched sequence's slot; fresh: the forward's own K|V rows [rows][2 kvd] past its committed ones. */
struct dllm__kvq_codes {
    void *k_codes, *v_codes, *k_pairs, *v_side, *sinks;
    const void *fresh;
    int capacity, group, sink_rows;
};

/* [KV quant] [batch] One sequence's committed cache in bd_forward_batch under kv_quant: what kvq_begin allocates for a
 * generation alone (codes, pairs, V side, the sinks' bf16 rows, 9c's layout per layer, capacity rows), and its block
 * cache [layer][block rows][2 kvd] bf16 (committed_.block_cache's twin). */
struct dllm__gpu_kvq_slot {
    dllm__dbuf k_codes, v_codes, k_pairs, v_side, sinks, block_cache;
    int capacity = 0, group = 0, sink_rows = 0;
    dllm__kvq_codes codes(const void *fresh) const {
        return {k_codes.ptr, v_codes.ptr, k_pairs.ptr, v_side.ptr, sinks.ptr, fresh, capacity, group, sink_rows};
    }
};

/* [varlen] The work lists of a varlen attention (attn_args::varlen_work) and their shape: one flash_attn CTA (per head)
 * for each query tile of BR rows and split-KV share of each entry that has query rows, then one attn_combine CTA (per
 * head) for each row of each entry with more than one share. A grid fitting the longest entry and the most shares (as
 * the grids were) launched mostly CTAs with nothing to do: 16 sequences of which 2 fill 1024 rows and 14 step 32 rows
 * in 8 shares each make 16 x 32 x 248 CTAs of which ~4.4k work, and the idle ones cost the H100 tens of ms a forward.
 * The lists hold exactly the CTAs of those grids that worked, in the order the grids numbered them (entry, share, tile;
 * entry, row), each computing what it computed there, so no bit changes. */
struct dllm__attn_work_shape {
    int br = 0;                     // the query tile rows the list was made for (the launched kernel's arch.fa_br)
    int n_attn = 0, n_combine = 0;  // flash_attn's int4 items, then attn_combine's int2 items
};
/* [KV quant] [batch] One sequence's attention over its committed codes in bd_forward_batch (what kvq_attention takes
 * for it alone): its query rows, keys, committed rows, block-causal mask and first query's sequence index. */
struct dllm__kvq_batch_seq {
    int T = 0, n_keys = 0, n_committed = 0, mask_block = 0, pos0 = 0;
};
/* [KV quant] One kvq_flash launch's shape: warps a CTA (16 query rows each), CTAs over the group's rows, keys a split,
 * splits. */
struct dllm__kvq_tc_plan {
    int warps = 0, q_tiles = 0, split_keys = 0, n_splits = 0;
    size_t smem = 0;
};
/* [KV quant] [batch] A chunk of one sequence's query rows [r0, r0 + rows), as kvq_attention launches it alone: under
 * kvq_tc at most dllm__kvq_tc_chunk_rows rows with its own plan and its split states at `partial` floats into the
 * batch's; else the sequence's rows in one chunk. */
struct dllm__kvq_batch_chunk {
    int seq = 0, r0 = 0, rows = 0;
    dllm__kvq_tc_plan plan;
    size_t partial = 0;
};
/* [KV quant] [batch] One kvq_flash_batch launch: the chunks of one CTA shape (warps, row tiles), its items (one a
 * chunk) [first, first + count) of the work's, its grid (the most splits of its chunks, kv heads, count x q_tiles) and
 * dynamic shared memory. */
struct dllm__kvq_batch_group {
    int warps = 0, q_tiles = 0, max_splits = 0, first = 0, count = 0;
    size_t smem = 0;
};
/* [KV quant] [batch] One layer's attention over every sequence's codes, the same for every layer
 * (dllm__kvq_batch_work_of): the chunks; the kvq_flash_batch items (a chunk each), by group (the CTA shapes in the
 * order the chunks first take them), in a group in chunk order; then the (chunk, row) items of kvq_flash_combine or
 * kvq_attention; the groups, and the split states' floats. */
struct dllm__kvq_batch_work {
    bool tc = false;
    std::vector<dllm__kvq_batch_chunk> chunks;
    std::vector<kvq_item> items;
    std::vector<dllm__kvq_batch_group> groups;
    int n_flash = 0;
    size_t partial_floats = 0;
};

/* [batch] The batched forwards' state (dllm_generate_batch, dllm_stepper): the varlen attention, the slots of the
 * batched K/V-cache step and of batched block diffusion, the layout's offsets, and the device token choice. */
struct dllm__gpu_batch {
    std::shared_ptr<dllm__module>
        varlen_module;  // flash_attn's varlen instantiation, loaded by the first batched forward
    dllm__kernel<void(attn_args)> attn, attn_short;  // the table's tiles; dllm__attn_short_tiles
    dllm__kernel<void(attn_args)> combine;           // attn_combine's varlen instantiation
    // [dual cache] [prefix cache] per attention entry its split-KV shares and the offset of its partial states (as a
    // solo step splits them: dllm__attn_entry_splits), the most shares, and the states
    dllm__dbuf attn_splits, attn_partial;
    int max_splits = 1;
    // the varlen attention's work lists (dllm__attn_varlen_work): on the host (the graph key), on the device, the shape
    std::vector<int32_t> work_items;
    dllm__dbuf attn_work;
    dllm__attn_work_shape work;
    std::vector<char> attn_wide;  // [block diffusion] entries attended apart (attention_wide_entry), none of the lists
    dllm__dbuf row_offsets;  // int [sequences + 1]: the batched forward's row offsets (dllm__varlen_layout)
    // [dual cache] [prefix cache] every slot's K|V rows, per layer [kv_rows rows][2 n_kv head_dim] bf16 (slot s at rows
    // [slot_base[s], + slot_rows[s])); the layout's attention offsets and cache rows
    dllm__dbuf kv, attn_q_offsets, attn_kv_offsets, cache_rows;
    std::vector<int> slot_base, slot_rows;
    int kv_rows = 0;
    // [block diffusion] bd_forward_batch: its slots' states (kv's slots) and the layout's per-sequence masks
    std::vector<dllm__bd_slot> bd_slots;
    dllm__dbuf attn_masks;
    // batch_choose: each sequence's step state (its global_step keys the draws), the chosen rows' x0, conf, deferred
    dllm__dbuf choice_state, choice_x0, choice_conf, choice_deferred;
    int64_t rows_chosen = 0;  // rows chosen on the device by batch_choose since the context began (tests)
    std::vector<dllm__gemm_run> gemm_runs;  // the running batched forward's, for its BF16 GEMMs (gemm_bf16_batch)
    // [KV quant] bd_forward_batch under kv_quant (gpu/batch_kvq.cpp): each slot's codes (no bf16 rows in kv), one
    // layer's forwarded K|V rows of every sequence [rows][2 kvd], and the running forward's sequences
    std::vector<dllm__gpu_kvq_slot> kvq_slots;
    dllm__dbuf kvq_fresh;
    const std::vector<dllm__bd_seq> *kvq_seqs = nullptr;
    // the layout's attention over every committed cache (kvq_batch_upload): its work, the kvq_args of each
    // (layer, chunk) [layer][chunk] (on the host as uploaded), the items, the split states
    dllm__kvq_batch_work kvq_work;
    std::vector<kvq_args> kvq_args_host;
    dllm__dbuf kvq_chunks, kvq_items, kvq_partial;
    int64_t bd_forwards = 0;  // bd_forward_batch calls that ran since the context began (tests: one a round)
};

/* [block diffusion] (16.4.3) Per layer, the committed rows [0, n) then the rows a forward attends to beyond them (its
 * fresh K/V or the block cache), bf16 K|V rows [layer][capacity][2 n_kv head_dim] (not under kv_quant); the block cache
 * likewise [layer][block_rows][...]. */
struct dllm__gpu_committed {
    dllm__dbuf kv, block_cache, partial;
    int n = 0, capacity = 0, block_rows = 0;
};

/* [KV quant] (9c on the device) The committed rows as codes only, 9c's layout per layer; bf16 K|V rows for the
 * committed sinks [layer][sink_rows][2 kvd] and for one layer's forwarded rows at a time [rows][2 kvd]
 * (the layers take turns: a commit quantises its layer's rows before the next layer's are written). */
struct dllm__gpu_kv_codes {
    dllm__kvq_kernels kernels;
    std::vector<dllm__rotation_dev> rotations;
    dllm__dbuf k_codes, v_codes, k_pairs, v_side;  // v_side: KIVI's pairs or SoloQ's scales, 4 bytes a (row, kv head)
    dllm__dbuf sinks, fresh;
    int sink_rows = 0;           // min(n_sink, the committed capacity)
    bool keep_rows = false;      // tests: kept holds each commit's bf16 rows
    std::vector<uint16_t> kept;  // [layer][capacity][2 kvd]
    dllm__kvq_tc_kernels flash;  // kvq_tc: kvq_flash (loaded by kvq_begin; module null: kvq_attention runs)
    dllm__dbuf flash_partial;    // its split states (dllm__kvq_tc_partial_bound)
    bool flash_on = false;       // kvq_flash runs: the switch was on at bd_begin and the head dim is one it takes
};

struct dllm__stage_timer;

/* The kernels of the modules every context loads (row-wise, sampler, attention) and the K/V scatter of the batched and
 * block-diffusion caches. */
struct dllm__gpu_kernels {
    std::shared_ptr<dllm__module> rowwise_module, sampler_module, attn_module, kv_scatter_module;
    dllm__rowwise_kernels rowwise;
    dllm__sampler_kernels sampler;
    dllm__attn_kernels attention;
    dllm__kernel<dllm__sig_kv_scatter_rows> kv_scatter;
};

/* The GEMMs: cuBLASLt with dllm's Hopper GEMM as a candidate (dense), that GEMM's narrower tiles for the batched
 * forwards, and the FP8 path in effect. */
struct dllm__gpu_gemms {
    dllm__gemm dense;
    dllm__gemm_wg wg;                     // dllm's Hopper GEMM, a candidate of dense
    dllm__gemm_wg wg_n128;                // its 128-wide tiles, for the batched forwards (batch_gemm_wg)
    dllm__gemm_wg wg_n64;                 // its 64-wide tiles, for the batched forwards (batch_gemm_wg)
    dllm__gemm_splitk splitk;             // every BF16 layer GEMM where loaded (sm_90a): row-independent at any M
    dllm__fp8_gemm fp8 = DLLM__FP8_NONE;  // in effect
    dllm__fp8_mma fp8_mma;                // loaded when fp8 is DLLM__FP8_MMA
};

/* Pinned host memory (cudaFreeHost by its owner). */
struct dllm__pinned {
    void *ptr = nullptr;
    size_t bytes = 0;
};

/* [debug hooks] What tests and benchmarks set: the stage timer, the host's token choice, FACache off, the rows to copy
 * out, the last layer's rows. */
struct dllm__gpu_debug {
    dllm__stage_timer *timer = nullptr;
    bool host_choice = false, facache_off = false;
    std::map<std::pair<int, int>, std::vector<float>> *rows = nullptr;
    int last_layer_rows = 0;
};

/* [SoloQ] The 4-bit formats on the device: the options, the SoloQ module (rotations, quantisers, producers), the W4
 * GEMM for few rows, q4wg and the INT8 path. */
struct dllm__gpu_lowbit {
    dllm__soloq_options options;           // requested (and in effect: the GPU runs every SoloQ precision)
    std::shared_ptr<dllm__module> module;  // loaded when options.enabled
    dllm__soloq_kernels kernels;
    dllm__q4_gemm_kernels q4_gemm;             // [W4 GEMM] the GEMM of DLLM__W_Q4 weights for few rows
    std::unique_ptr<dllm__q4wg_kernels> q4wg;  // [W4 GEMM] q4wg (sm_90a, integer formats, quantised activations)
    bool int8_path = true;                     // [INT8 GEMM] gemm_q4 may take its INT8 path (see q4_int8)
    int act_forms = 0;                         // what the last SoloQ producer wrote: 1 bf16 act_.q4a, 2 int8 act_.q4a8
    long int8_launches = 0;                    // GEMMs gemm_q4 ran on the INT8 path (the tests check it runs)
};

/* The captured forwards: the plain step's graph ([step graphs]) and the slots of block-diffusion and batched
 * forwards. */
struct dllm__gpu_graphs {
    cudaGraphExec_t step_exec = nullptr;
    std::string step_key, step_config, warmed_key;                      // step_config: graph_key() of the captured step
    dllm__graph_set block_diffusion{"a block-diffusion step forward"};  // [bd graphs] slots by dllm__bd_graph_keys
    dllm__graph_set batched{"a batched forward"};                       // [batch graphs] slots by varlen_graph_id
};

/* [FACache] on block diffusion: layer 0's committed states per block offset on the device, the tokens they were
 * computed for on the host (-1: none), valid while the committed length is n (a commit or bd_begin drops them); rows
 * seen and reused under call.lacache since bd_begin (dllm_gen_stats). */
struct dllm__gpu_bdfa {
    dllm__bdfa_kernels kernels;
    dllm__dbuf state, rows;
    std::vector<int32_t> tokens;
    std::vector<int> list;
    int n = -1;
    int64_t rows_seen = 0, rows_reused = 0;
};

/* [MoE] LLaDA2's mixture of experts on the device (gpu/moe.cpp): its module, the expert weights' addresses, and per MoE
 * layer the router's fp32 logits, each token's experts and weights, the routes' plan (the slots (token, k) sorted by
 * expert, each expert's rows and row tiles), the experts' rows and the shared expert's rows. All of it stays on the
 * device (sized by the row count alone), so LLaDA2's forwards are captured as graphs like the others. */
struct dllm__gpu_moe {
    std::shared_ptr<dllm__module> module;
    dllm__kernel<dllm__sig_qk_norm_rope> qk_norm_rope;
    dllm__kernel<dllm__sig_moe_route> route;
    dllm__kernel<dllm__sig_moe_plan> plan_kernel;
    dllm__kernel<dllm__sig_moe_grouped_gemm> grouped_gemm;
    // [FP8] [SoloQ] the grouped GEMM on E4M3 experts, and on 4-bit ones by weight format (dllm__q4_format)
    dllm__kernel<dllm__sig_moe_grouped_gemm_e4m3> grouped_gemm_e4m3;
    dllm__kernel<dllm__sig_moe_grouped_gemm_int4> grouped_gemm_q4[DLLM__Q4_RTN + 1];
    dllm__kernel<dllm__sig_moe_combine> combine;
    dllm__dbuf expert_ptrs;  // [layers][gate|up, down][codes, scales, block scales][E] (dllm__moe_ptr)
    dllm__dbuf logits, expert, weight;  // fp32 [T][E], int [T][k], fp32 [T][k]
    dllm__dbuf plan;                    // int [2][E + 1]: first_row, then tile_first (moe_plan)
    dllm__dbuf row_token, slot_row;     // int [T k]: the token of each expert row; int [T][k]: the row of each slot
    dllm__dbuf gu, f, y;                // bf16 [T k][2 ff], [T k][ff], [T k][d]: the experts' rows
    dllm__dbuf shared_gu, shared_f, shared_y;  // bf16 [T][2 ff_shared], [T][ff_shared], [T][d]
    // [FP8] [SoloQ] the experts' inputs quantised (moe_fit): the normed rows' codes or C values and scales, the SwiGLU
    // rows' E4M3 codes (SoloQ's C values go to f) and scales
    dllm__dbuf x_codes, x_scale, f_codes, f_scale;
    std::vector<const void *> addresses() const {
        return {logits.ptr, expert.ptr,    weight.ptr,    slot_row.ptr, row_token.ptr, plan.ptr,   gu.ptr,
                f.ptr,      y.ptr,         shared_gu.ptr, shared_f.ptr, shared_y.ptr,  x_codes.ptr, x_scale.ptr,
                f_codes.ptr, f_scale.ptr};
    }
    // [debug hooks] when set, each MoE layer's chosen experts [T][k] and router logits [T][E] of the last forward
    std::map<int, std::vector<int>> *debug_experts = nullptr;
    std::map<int, std::vector<float>> *debug_logits = nullptr;
};

class dllm__gpu_backend : public dllm__backend_impl {
  public:
    static dllm_status create(const dllm_model &m, const dllm_ctx_params &p, int max_tokens,
                              std::unique_ptr<dllm__backend_impl> &out) {
        std::unique_ptr<dllm__gpu_backend> g(new dllm__gpu_backend(m, max_tokens));
        g->precision_ = p.precision;
        DLLM__TRY(dllm__soloq_options_for(p.precision, p.quantize_lm_head, p.soloq_rotation, p.soloq_bias_correction,
                                          g->lowbit_.options));
        g->lowbit_.options =
            dllm__soloq_effective_options(m, g->lowbit_.options);  // a quantised checkpoint's stored options
        g->kvq_.setup(m.cfg, p.kv_quant, p.kv_sink_tokens);
        DLLM__TRY(g->init(p.device, {p.progress, p.progress_user_data}));
        out = std::move(g);
        return DLLM_OK;
    }
    ~dllm__gpu_backend() override {
        if (graphs_.step_exec) cudaGraphExecDestroy(graphs_.step_exec);
        graphs_drop(graphs_.block_diffusion);
        graphs_drop(graphs_.batched);
        if (stream_) cudaStreamDestroy(stream_);
        if (host_pinned_.ptr) cudaFreeHost(host_pinned_.ptr);
    }

    dllm_status logits(const int32_t *ids, int n, int r0, int r1, float *out) override;
    dllm_status begin(dllm__decode &st) override;
    dllm_status begin_block(dllm__decode &st) override;
    dllm_status step(dllm__decode &st, std::vector<int32_t> &committed, bool want_host) override;
    dllm_status finish(dllm__decode &st) override;
    // block diffusion (16.4.3)
    dllm_status bd_begin(int rows) override;
    dllm_status bd_rows_that_fit(int group, int64_t &rows) const override;
    dllm_status bd_forward(const dllm__bd_call &call, float *logits) override;
    bool bd_chooses() const override { return !debug_.host_choice; }
    dllm_status bd_forward_choose(const dllm__bd_call &call, const dllm__bd_pick &pick, dllm__choice *out) override;
    void bd_facache_rows(int64_t &rows, int64_t &reused) const override {
        rows = facache_.rows_seen, reused = facache_.rows_reused;
    }
    // [batch] decoding (dllm_generate_batch): every canvas's rows in one forward
    dllm__batch_caps batch_caps() const override;
    dllm_status forward_batch(const std::vector<dllm__batch_seq> &plan, float *out) override;
    /* Why this context's forwards cannot batch (the items then decode one after another), or null. */
    const char *batch_unsupported() const;
    // [batch] [dual cache] [prefix cache] the batched K/V-cache step (16.4.1): its slots and its forward
    const char *batch_kv_unsupported() const;
    dllm_status batch_kv_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) override;
    using dllm__backend_impl::batch_kv_reserve;  // the one-list form too (every slot empty)
    dllm_status forward_batch_kv(const std::vector<dllm__batch_seq> &plan, float *out) override;
    // [batch] [block diffusion] the batched block-diffusion forward (16.4.1; bd_batch): its slots and its forward
    const char *bd_batch_unsupported() const;
    dllm_status bd_batch_reserve(const std::vector<int> &rows, const std::vector<bool> &keep) override;
    using dllm__backend_impl::bd_batch_reserve;
    dllm_status bd_forward_batch(const std::vector<dllm__bd_seq> &seqs, float *logits, dllm__choice *choices) override;
    /* The layout of a plan over the reserved slots (dllm__kv_layout_of), for batch_logits. */
    dllm_status kv_layout(const std::vector<dllm__batch_seq> &plan, dllm__varlen_layout &v) const {
        return dllm__kv_layout_of(model_.cfg, plan, batch_.slot_base, batch_.slot_rows, max_tokens_, v);
    }
    /* The batched forward of a layout (dllm__varlen_layout_of) with the LM head over its gathered logit rows in chunks;
     * on_chunk(c0, rows) runs (on the host, stream-ordered) after each chunk's logits are in the logits buffer. Each
     * sequence's logits carry the bits they have in a batch of any other sequences, or alone. */
    template <class F> dllm_status batch_logits(const dllm__varlen_layout &v, F &&on_chunk) {
        DLLM__TRY(prepare_batch(v));
        batch_on_ = true;  // every GEMM DLLM__ROWS_BATCH (lacache_rows, layer_rows), each sequence's rows of its kind
        batch_.gemm_runs = dllm__gemm_runs_of(v);
        dllm_status s = forward_varlen_replayed(v);
        const dllm__config &c = model_.cfg;
        for (int c0 = 0; s == DLLM_OK && c0 < v.out_rows; c0 += dllm__lm_chunk_rows) {
            const int rows = std::min(dllm__lm_chunk_rows, v.out_rows - c0);
            s = gemm(weights_->lm_head(c), (const char *)act_.y.ptr + (size_t)c0 * c.n_embd * 2, act_.logits.ptr, rows,
                     DLLM__ROWS_BATCH, CUDA_R_32F);
            if (s == DLLM_OK) s = on_chunk(c0, rows);
        }
        batch_on_ = false;
        batch_.gemm_runs.clear();
        return s;
    }
    dllm_status batch_logits_to_host(const std::vector<dllm__batch_seq> &plan, const dllm__varlen_layout &v,
                                     float *out);
    // [batch] the token choice of a batched step on the device
    bool batch_chooses() const override { return !batch_unsupported(); }
    bool solo_equals_batch() const override { return false; }  // the solo forwards tune GEMMs and attention per shape
    dllm_status forward_batch_choose(const std::vector<dllm__batch_seq> &plan, bool kv, float *logits,
                                     dllm__choice *choices) override;
    /* batch_logits with the sampler run over each chunk's rows of the sequences with a sampling (their choices to the
     * host), and the other sequences' logits copied to the host as batch_logits_to_host does. */
    dllm_status batch_choose(const std::vector<dllm__batch_seq> &plan, const dllm__varlen_layout &v, float *logits,
                             dllm__choice *choices);
    dllm_status choose_in_chunks(const dllm__varlen_layout &v, const std::vector<const dllm__sampling *> &sampling,
                                 const std::vector<dllm_step_state> &states, const std::vector<int> &raw0, int n_chosen,
                                 const std::function<std::vector<dllm__sampler_span>(int, int)> &spans_of, float *raw,
                                 dllm__choice *choices);

    // [debug hooks] what tests and benchmarks read (16.5)
    DLLM__TEST_HOOKS_BEGIN
    DLLM__TEST_HOOK const dllm__arch &arch() const { return arch_; }
    DLLM__TEST_HOOK cudaStream_t stream() const { return stream_; }
    /* [batch] Rows whose tokens batch_choose chose on the device, since the context began. */
    DLLM__TEST_HOOK int64_t batch_rows_chosen() const { return batch_.rows_chosen; }
    /* [batch] [block diffusion] bd_forward_batch calls since the context began, and (kv_quant) the device bytes of the
     * slots' committed caches: their codes, pairs, V sides and sinks, and the bf16 slot rows (none under kv_quant). */
    DLLM__TEST_HOOK int64_t bd_batch_forwards() const { return batch_.bd_forwards; }
    DLLM__TEST_HOOK size_t bd_batch_committed_bytes() const {
        size_t n = batch_.kv.bytes;
        for (const dllm__gpu_kvq_slot &k : batch_.kvq_slots)
            n += k.k_codes.bytes + k.v_codes.bytes + k.k_pairs.bytes + k.v_side.bytes + k.sinks.bytes;
        return n;
    }
    /* Whether layers >= 1 run their FFN / attention projections in FP8 (requested and supported here). */
    DLLM__TEST_HOOK bool fp8_ffn_active() const { return weights_->fp8_ffn; }
    DLLM__TEST_HOOK bool fp8_attn_active() const { return weights_->fp8_attn; }
    /* The GEMM those run on (DLLM__FP8_NONE when neither is active). */
    DLLM__TEST_HOOK dllm__fp8_gemm fp8_gemm() const { return gemms_.fp8; }
    /* [batch] The widths the batched GEMMs may take, summed: 256 + 128 + 64 where all loaded, 0 where none (cuBLASLt's
     * pinned). */
    DLLM__TEST_HOOK int batch_gemm_widths() const {
        return (gemms_.wg_n64.kernel.fn ? 64 : 0) + (gemms_.wg_n128.kernel.fn ? 128 : 0) +
               (gemms_.wg.kernel.fn ? 256 : 0);
    }
    /* Block diffusion's token choice on the host (bd_forward's logits through dllm__choose) instead of the device's:
     * what gpu.bd_choose_on_device_matches_the_host compares the device's choice with. */
    DLLM__TEST_HOOK void bd_choose_on_host(bool on) { debug_.host_choice = on; }
    /* [FACache] Layer 0 through flash_attn instead of the split attention: what the split one is compared with. */
    DLLM__TEST_HOOK void bd_split_attention(bool on) { debug_.facache_off = !on; }
    /* The shared device weights this context reads. */
    DLLM__TEST_HOOK const dllm__gpu_weights &weights() const { return *weights_; }
    /* A single plain forward of ids[0..n) (no block, so tiles in plain order), for dllm_logits and benchmarks. */
    dllm_status prepare_forward(const int32_t *ids, int n, int raw_rows);
    /* The forward prepared above with the LM head over output rows [raw0, raw1) in chunks; on_chunk(c0, rows) runs
     * (on the host, stream-ordered) after each chunk's logits are in the logits buffer. */
    template <class F> dllm_status forward_logits(int n, int raw0, int raw1, F &&on_chunk) {
        dllm__forward_plan plan;
        dllm__seq_rows r;
        r.seq = n, r.q0 = 0, r.q1 = n, r.out0 = raw0, r.out1 = raw1;
        plan.seqs.assign(1, r);
        DLLM__TRY(forward(plan, act_.canvas.as<int>()));
        for (int c0 = 0; c0 < raw1 - raw0; c0 += dllm__lm_chunk_rows) {
            int rows = std::min(dllm__lm_chunk_rows, raw1 - raw0 - c0);
            DLLM__TRY(lm_head(1, raw1 - raw0, c0, rows));
            mark("lm head");
            DLLM__TRY(on_chunk(c0, rows));
        }
        return DLLM_OK;
    }
    DLLM__TEST_HOOK void set_timer(dllm__stage_timer *t) { debug_.timer = t; }
    /* [MoE] Layer l's mixture of experts alone (moe_block) on M bf16 rows x [M][d] (the FFN norm's output): the
     * bf16 output rows into out [M][d], the chosen experts [M][k] into experts. */
    DLLM__TEST_HOOK dllm_status moe_rows(size_t l, const std::vector<uint16_t> &x, int M, std::vector<uint16_t> &out,
                                         std::vector<int> &experts) {
        const size_t d = (size_t)model_.cfg.n_embd;
        DLLM__TRY(fit_buffers(1, M, 1));
        DLLM__CUDA(cudaMemcpyAsync(act_.a.ptr, x.data(), (size_t)M * d * 2, cudaMemcpyHostToDevice, stream_));
        DLLM__TRY(moe_block(l, M, act_.delta.ptr));
        out.resize((size_t)M * d), experts.resize((size_t)M * model_.cfg.n_expert_used);
        DLLM__CUDA(cudaMemcpyAsync(out.data(), act_.delta.ptr, out.size() * 2, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(
            cudaMemcpyAsync(experts.data(), moe_.expert.ptr, experts.size() * 4, cudaMemcpyDeviceToHost, stream_));
        DLLM__CUDA(cudaStreamSynchronize(stream_));
        return DLLM_OK;
    }
    /* [MoE] From now on each MoE layer's chosen experts [T][k] and router logits [T][E] of a forward, by layer (null:
     * none kept). */
    DLLM__TEST_HOOK void set_moe_debug(std::map<int, std::vector<int>> *experts,
                                       std::map<int, std::vector<float>> *logits) {
        moe_.debug_experts = experts, moe_.debug_logits = logits;
    }
    /* [MoE] The routing of every MoE layer (router GEMM, top-k, plan) over the M normed rows of the last forward,
     * enqueued on the stream (dllm-bench captures it as a graph to time it alone). */
    DLLM__TEST_HOOK dllm_status moe_route_all(int M);
    DLLM__TEST_HOOK dllm_status profile_step(const dllm__decode &st, dllm__stage_timer &t);
    DLLM__TEST_HOOK void set_debug_rows(std::map<std::pair<int, int>, std::vector<float>> *rows) { debug_.rows = rows; }
    DLLM__TEST_HOOK int last_layer_rows() const { return debug_.last_layer_rows; }
    DLLM__TEST_HOOK void set_q4_int8(bool on) {
        lowbit_.int8_path = on;
    }  // off: gemm_q4's INT8 path never runs (the tests compare)
    DLLM__TEST_HOOK long q4_int8_launches() const { return lowbit_.int8_launches; }
    DLLM__TEST_HOOK dllm_status kvq_snapshot(dllm__kvq &q, std::vector<float> &k, std::vector<float> &v);
    /* [KV quant] From the next bd_begin on, each commit's bf16 rows copied to the host for kvq_snapshot
     * (the device keeps only their codes). */
    DLLM__TEST_HOOK void kvq_keep_rows(bool on) { kv_codes_.keep_rows = on; }
    /* Device bytes of the committed K/V cache: bf16 rows, or under kv_quant codes, pairs, scales and the sinks'
     * rows. */
    size_t bd_committed_bytes() const {
        return committed_.kv.bytes + kv_codes_.k_codes.bytes + kv_codes_.v_codes.bytes + kv_codes_.k_pairs.bytes +
               kv_codes_.v_side.bytes + kv_codes_.sinks.bytes;
    }
    /* [KV quant] Device bytes beside the codes: the forwarded rows and kvq_flash's split states. */
    DLLM__TEST_HOOK size_t kvq_beside_bytes() const { return kv_codes_.fresh.bytes + kv_codes_.flash_partial.bytes; }
    /* [KV quant] Whether the attention over the quantised cache runs kvq_flash
     * (kvq_tc, by default, at the last bd_begin). */
    DLLM__TEST_HOOK bool kvq_tc_active() const { return kv_codes_.flash_on; }
    /* [bd graphs] Block-diffusion forwards since the context was made, by what they did (dllm__graph_action). */
    DLLM__TEST_HOOK int64_t bd_graph_count(dllm__graph_action a) const { return graphs_.block_diffusion.counts[a]; }
    DLLM__TEST_HOOK int64_t bd_graph_refusals() const { return graphs_.block_diffusion.refusals; }
    /* [batch graphs] The same for the batched forwards (forward_varlen_replayed). */
    DLLM__TEST_HOOK int64_t varlen_graph_count(dllm__graph_action a) const { return graphs_.batched.counts[a]; }
    DLLM__TEST_HOOK int64_t varlen_graph_refusals() const { return graphs_.batched.refusals; }
    /* [FP8] [batch] gemm() over M bf16 rows x (device) into y, DLLM__ROWS_BATCH or (batch false, at most pin_m rows)
     * INDEPENDENT, the buffers sized for M rows: what gpu_batch.fp8_gemm_batch_equals_the_solo_pinned_gemm compares. */
    DLLM__TEST_HOOK dllm_status gemm_rows(const dllm__weight_view &W, const void *x, void *y, int M, bool batch) {
        DLLM__TRY(fit_buffers(1, M, 1));
        return gemm(W, x, y, M, batch ? DLLM__ROWS_BATCH : DLLM__ROWS_INDEPENDENT);
    }
    DLLM__TEST_HOOKS_END

  private:
    dllm__gpu_backend(const dllm_model &m, int max_tokens) : model_(m), max_tokens_(max_tokens) {}
    dllm_status init(int device, const dllm__progress &progress);
    dllm_status load_kernels();
    dllm_status load_q4wg();
    dllm_status choose_precision(const char *gpu_name, bool &fp8_ffn, bool &fp8_attn);
    dllm_status fit_buffers(int batch, int seq, int lm_rows, bool lacache = false, bool kv_cache = false);
    // the forward and its stages (16.4.1)
    dllm_status forward(const dllm__forward_plan &plan, const int *ids_dev);
    dllm_status gemm(const dllm__weight_view &W, const void *x, void *y, int M, dllm__rows rows,
                     cudaDataType_t out = CUDA_R_16BF);
    dllm_status gemm_q4(const dllm__weight_view &W, const void *x, void *y, int M, dllm__rows rows, cudaDataType_t out);
    /* [SoloQ] Layers whose linears are DLLM__W_Q4; from layer 1 on their attention input is made by the fused producer
     * (layer 0's by LaCache's paths, which quantise it in the GEMM). */
    bool q4(size_t l) const { return weights_->layers[l].qkv.format == DLLM__W_Q4; }  // a LLaDA2 MoE layer has no gu
    bool produced_attn_input(size_t l) const { return fp8_attn(l) || (q4(l) && l > 0); }
    dllm_status next_layer_input(size_t l, float *h, int batch, int rows, bool soloq_producer);
    dllm_status soloq_add_rmsnorm(const dllm__weight_view &W, const float *h_in, float *h_out, const void *delta,
                                  const void *w, int M);
    dllm_status soloq_swiglu(const dllm__weight_view &W, const void *gu, int M);
    bool q4_int8(const dllm__weight_view &W, int M, bool pinned) const;
    dllm_status gemm_q4_int8(const dllm__weight_view &W, void *y, int M, cudaDataType_t out);
    soloq_args soloq_producer_args(const dllm__weight_view &W, int M);
    dllm__rows lacache_rows() const {
        return batch_on_                      ? DLLM__ROWS_BATCH
               : solo_kv_ != DLLM__ROWS_TUNED ? solo_kv_
               : kv_on_                       ? DLLM__ROWS_TUNED
                                              : DLLM__ROWS_INDEPENDENT;
    }
    dllm__rows layer_rows(size_t l) const {
        return batch_on_                      ? DLLM__ROWS_BATCH
               : solo_kv_ != DLLM__ROWS_TUNED ? solo_kv_
               : last_cut(l)                  ? lacache_rows()
                                              : DLLM__ROWS_TUNED;
    }
    /* The last layer (from layer 1 on): its rows after the attention feed only the output rows, so it may compute those
     * alone (forward), and its GEMMs are then row-independent. */
    bool last_cut(size_t l) const { return l > 0 && l + 1 == weights_->layers.size(); }
    bool fp8_ffn(size_t l) const { return weights_->fp8_ffn && l > 0; }
    bool fp8_attn(size_t l) const { return weights_->fp8_attn && l > 0; }
    int act8_rows(int M) const { return dllm__round_up(M, 16); }
    dllm_status embed_gather(const int *ids, int n_rows, float *h);
    dllm_status embed_gather_rows(const int *ids, int batch, int seq, int q0, int rows, float *h);
    dllm_status add_rmsnorm(const float *h_in, float *h_out, const void *delta, const void *w, void *y, int batch,
                            int seq, int row0, int n_rows);
    dllm_status add_rmsnorm_e4m3(const float *h_in, float *h_out, const void *delta, const void *w, int batch, int seq);
    dllm_status quantize_rows_e4m3(const void *x, int M, int K);
    dllm_status gemm_fp8_batch(const dllm__weight_view &W, const void *x, void *y, int M);
    dllm_status rope_qkv(void *qkv, const void *bias, int n_rows, int seq_len, int pos0);
    dllm_status attention(int batch, int seq, int q_rows, const void *q_rows_qkv, size_t q_bstride,
                          const void *keys_qkv, void *out, int fa_mode, bool may_split = false, bool wide = false,
                          int split_rows = 0);
    dllm_status layer0_attention(const dllm__forward_plan &plan, const int *ids);
    dllm_status self_attention(size_t layer, int batch, const dllm__seq_rows &r, int o0, int orows);
    dllm_status output_and_ffn(size_t l, int batch, int rows, int o0, int orows, const float *h_res, float *h_out);
    dllm_status project_o(size_t l, int M, int r0);
    dllm_status ffn(size_t l, int M, const float *h_in, float *h_out, int r0);
    dllm_status lm_head(int batch, int raw_rows, int c0, int rows);
    // [MoE] LLaDA2 (gpu/moe.cpp)
    bool moe_model() const { return model_.cfg.family == DLLM_FAMILY_LLADA2; }
    bool moe_layer(size_t l) const { return moe_model() && !weights_->layers[l].expert_gu.empty(); }
    dllm_status moe_supported() const;
    dllm_status load_moe();
    dllm_status qk_norm_rope(size_t layer, int T, int pos0, int r0 = 0);
    dllm_status qk_norm_rope_varlen(size_t layer, const dllm__varlen_layout &v);
    dllm_status moe_fit(int M);
    dllm_status moe_pointers();
    dllm_status moe_route(size_t l, int M);
    dllm_status moe_ffn(size_t l, int M, const float *h_in, float *h_out, int r0);
    dllm_status moe_block(size_t l, int M, void *out);
    dllm__wformat moe_format() const;
    dllm_status moe_grouped(size_t l, bool down, int M, const void *x, const float *x_scale, int x_scale_ld,
                            const int *row_src, void *y);
    // the batched forward (16.4.1)
    dllm_status load_varlen();
    dllm_status varlen_attention(const attn_args &a, int batch, int max_rows);
    bool varlen_short(int batch, int max_rows) const;
    dllm_status upload_varlen_work(const std::vector<int32_t> &q_offsets, const std::vector<int32_t> &splits,
                                   int max_rows);
    dllm_status load_kv_scatter();
    dllm_status prepare_batch(const dllm__varlen_layout &v);
    dllm_status forward_varlen(const dllm__varlen_layout &v);
    dllm_status forward_varlen_replayed(const dllm__varlen_layout &v);
    dllm__graph_id varlen_graph_id(const dllm__varlen_layout &v) const;
    dllm_status self_attention_varlen(size_t layer, const dllm__varlen_layout &v);
    dllm_status self_attention_varlen_kv(size_t layer, const dllm__varlen_layout &v);
    dllm_status attention_wide_entry(const attn_args &a, const dllm__varlen_layout &v, size_t e);
    dllm_status upload_kv_layout(const dllm__varlen_layout &v);
    dllm_status bkv_alloc(const std::vector<int> &rows, const std::vector<bool> &keep);
    void bkv_release();
    dllm_status llama4_scale_varlen(const dllm__varlen_layout &v);
    dllm_status bd_batch_choose(const std::vector<dllm__bd_seq> &seqs, const dllm__varlen_layout &v, float *logits,
                                dllm__choice *choices);
    // the step (16.4.2)
    dllm__forward_plan plan_step(const dllm__decode &st) const;
    dllm_status run_step(const dllm__decode &st);
    sampler_args sampler_over(const dllm__sampling &s, int n_rows, int pos0, int lrow0, int shift0, int raw_rows) const;
    dllm_status sample_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1);
    dllm_status launch_sampler(const sampler_args &a, int *x0, double *conf, unsigned char *deferred,
                               const dllm_step_state *state = nullptr);
    dllm_status sample_span(const dllm__sampling &s, const dllm__sampler_span &span, int raw_rows);
    dllm_status choices_to_host(const dllm__dbuf &x0, const dllm__dbuf &conf, const dllm__dbuf &deferred, int n,
                                dllm__choice *out);
    dllm_status capture_step(const dllm__decode &st, bool may_update);
    std::string graph_key(const dllm__decode &st) const;
    dllm_status record_rows(const dllm__decode &st, int batch, int cp0, int raw_rows, int s0, int s1);
    void mark(const char *stage);
    // block diffusion (16.4.3)
    dllm_status bd_logits(const int32_t *ids, int n, int r0, int r1, float *out);
    dllm_status bd_check(const dllm__bd_call &call) const;
    dllm_status bd_attention(size_t layer, const dllm__bd_call &call);
    attn_args bd_attn_args(const dllm__bd_call &call, const bf16_t *q, const char *kv, bf16_t *o, int n_keys,
                           int pos0) const;
    dllm_status bd_head(const dllm__bd_call &call, float *logits);
    dllm_status bd_prepare(const dllm__bd_call &call, int choose_rows = 0);
    dllm_status bd_layers(const dllm__bd_call &call);
    dllm_status bd_body(const dllm__bd_call &call, const dllm__bd_pick *pick, bool head);
    sampler_args bd_sampler_args(const dllm__bd_call &call, const dllm__bd_pick &pick) const;
    // [bd graphs]
    dllm_status bd_run(const dllm__bd_call &call, const dllm__bd_pick *pick, bool head);
    dllm_status bd_replay(const dllm__bd_call &call, const dllm__bd_pick *pick);
    dllm__graph_id bd_graph_id(const dllm__bd_call &call, const dllm__bd_pick *pick) const;
    const dllm__gemm_wg *batch_gemm_wg(const dllm__gemm_op &op);
    dllm_status gemm_bf16_independent(const dllm__gemm_op &op, bool step);
    dllm_status gemm_bf16_batch(const dllm__gemm_op &op);
    /* Whether gemm_splitk runs y = x . W^T (BF16): loaded, W's shape whole tiles, the workspace sized for it. */
    bool splitk_fits(const dllm__weight_view &W, const void *x, const void *y) const {
        return gemms_.splitk.module && dllm__splitk_takes(x, W.data, y, W.n, W.k) &&
               act_.splitk_ws.bytes / 4 >=
                   dllm__splitk_workspace_floats(W.n, dllm__splitk_cut_of(W.n, W.k, gemms_.splitk.sm_count));
    }
    // [bd graphs] [batch graphs]
    template <class F> dllm_status replay_graph(dllm__graph_set &set, const dllm__graph_id &id, F &&body);
    template <class F>
    dllm_status capture_graph(dllm__graph_set &set, dllm__graph_slot &g, dllm__graph_action &action, F &&body);
    void graphs_drop(dllm__graph_set &set);

    const dllm_model &model_;
    int max_tokens_;
    int device_ = 0, n_sms_ = 1, smem_per_sm_ = 0;  // shared memory an SM holds (varlen_attention's wave rule)
    dllm__arch arch_ = {};
    cudaStream_t stream_ = nullptr;
    std::shared_ptr<const dllm__gpu_weights> weights_;  // [shared weights]
    dllm__dbuf rope_cos_, rope_sin_;                    // fp32 [max_tokens][head_dim / 2]

    // kernels and GEMMs
    dllm__gpu_kernels kernels_;
    dllm__gpu_gemms gemms_;
    dllm_precision precision_ = DLLM_PRECISION_BF16;  // requested
    dllm__gpu_lowbit lowbit_;  // [SoloQ] [W4 GEMM] [INT8 GEMM] the 4-bit formats' options, kernels and GEMM paths
    // activations and the generation's state
    dllm__activations act_;
    bool kv_on_ = false;         // forwards read and write act_.kv (a generation with a K/V cache)
    bool batch_on_ = false;      // a batched forward runs (batch_logits): every GEMM DLLM__ROWS_BATCH
    // A solo forward under a K/V cache runs (forward, and its LM head): DLLM__ROWS_STEP or _FILL, a batched forward's
    // GEMMs for the same sequence; TUNED: none
    dllm__rows solo_kv_ = DLLM__ROWS_TUNED;
    dllm__gpu_batch batch_;      // [batch] the batched forwards' kernels, slots, layout and device token choice
    bool positions_on_ = false;  // [DPad] act_.positions holds the canvas rows' RoPE positions
    dllm__pinned host_pinned_;   // canvas + committed list + state for the step callback

    dllm__gpu_graphs graphs_;  // [step graphs] [bd graphs] [batch graphs] the captured forwards

    dllm__gpu_moe moe_;              // [MoE] LLaDA2's router, experts and their buffers
    dllm__gpu_committed committed_;  // [block diffusion] the committed K/V rows and the block cache
    dllm__kvq kvq_;                  // [KV quant] the settings and the host rotations (its vectors empty)
    dllm__gpu_kv_codes kv_codes_;    // [KV quant] the committed rows as codes, on the device
    dllm_status kvq_load();
    dllm_status kvq_fit(dllm__dbuf &k_codes, dllm__dbuf &v_codes, dllm__dbuf &v_side, dllm__dbuf &sinks, int rows,
                        int sink_rows);
    dllm_status kvq_begin(int rows);
    dllm_status kvq_tc_begin();
    dllm__kvq_codes kvq_codes_solo() const {
        return {kv_codes_.k_codes.ptr, kv_codes_.v_codes.ptr, kv_codes_.k_pairs.ptr, kv_codes_.v_side.ptr,
                kv_codes_.sinks.ptr,   kv_codes_.fresh.ptr,   committed_.capacity,   kvq_.group,
                kv_codes_.sink_rows};
    }
    kvq_args kvq_layer_args(const dllm__kvq_codes &at, size_t layer) const;
    dllm_status kvq_commit(const dllm__kvq_codes &at, size_t layer, int row0, int T);
    dllm_status kvq_keep(size_t layer, int row0, int T);
    dllm_status kvq_attention(const dllm__kvq_codes &at, size_t layer, const bf16_t *q, bf16_t *o, int T, int n_keys,
                              int n_committed, int mask_block, int pos0);
    // [KV quant] [batch] bd_forward_batch under kv_quant (gpu/batch_kvq.cpp)
    dllm_status kvq_batch_reserve(const std::vector<int> &rows, const std::vector<bool> &keep);
    dllm_status kvq_batch_prepare(const std::vector<dllm__bd_seq> &seqs, int rows);
    dllm_status kvq_batch_upload(const dllm__varlen_layout &v);
    kvq_args kvq_attention_args(const dllm__kvq_codes &at, size_t layer, const bf16_t *q, bf16_t *o, int n_keys,
                                int n_committed, int mask_block, int pos0) const;
    const char *kvq_batch_fresh_rows(const dllm__varlen_layout &v, size_t i) const;
    char *kvq_batch_block_rows(const dllm__gpu_kvq_slot &k, size_t layer, int rows) const;
    dllm_status kvq_batch_qkv(size_t layer, const dllm__varlen_layout &v);
    dllm_status kvq_batch_keep_blocks(size_t layer, const dllm__varlen_layout &v);
    dllm_status kvq_batch_attention_uncommitted(size_t layer, const dllm__varlen_layout &v);
    dllm_status kvq_batch_attention_committed(size_t layer);
    dllm_status kvq_batch_commit(size_t layer, const dllm__varlen_layout &v);
    dllm_status self_attention_varlen_kvq(size_t layer, const dllm__varlen_layout &v);
    std::string kvq_batch_graph_key() const;
    dllm__gpu_bdfa facache_;  // [FACache] on block diffusion: layer 0's committed states
    bool bdfa_on(size_t layer) const;
    dllm_status bdfa_prepare(const dllm__bd_call &call);
    dllm_status bdfa_attention(const dllm__bd_call &call, int n_keys, int pos0);

    dllm__gpu_debug debug_;  // [debug hooks]
};

/* flash_attn_wg's Q, K and V maps (attn_tensor_maps on the device); false where TMA is unavailable. */
struct dllm__attn_tensor_maps {
    CUtensorMap q, k, v;
};
static bool dllm__attn_maps(const attn_args &a, const dllm__arch &arch, int hd, int heads, int batch,
                            dllm__attn_tensor_maps &tm) {
    const int kv_width = heads / a.group * hd;
    return dllm__tensor_map(tm.q, a.q, heads * hd, a.q_rows, batch, (uint64_t)a.q_stride, a.q_bstride, 128) &&
           dllm__tensor_map(tm.k, a.k, kv_width, a.seq, batch, (uint64_t)a.kv_stride, (uint64_t)a.seq * a.kv_stride,
                            arch.fa_wg_bc) &&
           dllm__tensor_map(tm.v, a.v, kv_width, a.seq, batch, (uint64_t)a.kv_stride, (uint64_t)a.seq * a.kv_stride,
                            arch.fa_wg_bc);
}

/* Attention for batch x heads over a.q_rows query rows: flash_attn, then (a.kv_splits > 1) the combine of the per-split
 * states in a.partial. With `wide`, a forward without FACache and split-KV (block-causal or not) runs flash_attn_wg
 * where the GPU has it; callers ask for it only where no other path must match flash_attn's bits
 * (layers >= 1: LaCache's exactness rests on layer 0). */
static dllm_status dllm__attn_launch(const dllm__attn_kernels &k, const dllm__arch &arch, int hd, int heads, int batch,
                                     const attn_args &a, cudaStream_t s, bool wide = false) {
    if (wide && k.wide.fn && a.fa_mode == 0 && a.kv_splits == 1) {
        dllm__attn_tensor_maps tm;
        if (dllm__attn_maps(a, arch, hd, heads, batch, tm)) {
            dim3 grid((unsigned)((a.q_rows + 127) / 128), (unsigned)heads, (unsigned)batch);
            return k.wide.launch({grid, dim3(384), dllm__attn_wide_smem(hd, arch)}, s, a, tm);
        }
        static std::atomic<bool> warned(false);
        if (!warned.exchange(true))
            dllm__log(
                DLLM_LOG_WARN,
                "no TMA tensor map for the wgmma attention (driver without cuTensorMapEncodeTiled, or a layout it "
                "refuses): attention runs flash_attn (mma.sync)");
    }
    dim3 grid((unsigned)((a.q_rows + arch.fa_br - 1) / arch.fa_br), (unsigned)heads, (unsigned)(batch * a.kv_splits));
    DLLM__TRY(k.attn.launch({grid, dim3((unsigned)dllm__attn_threads(arch)), dllm__attn_smem(hd, arch)}, s, a));
    if (a.kv_splits == 1) return DLLM_OK;
    return k.combine.launch({dim3((unsigned)a.q_rows, (unsigned)heads, (unsigned)batch), dim3((unsigned)hd)}, s, a);
}

/* The lists for entries [q_offsets[e], q_offsets[e + 1]) with shares splits[2e] (empty: 1 each) and tiles of br rows,
 * into items: flash_attn's (tile, entry, share, 0), then attn_combine's (entry, row). */
static dllm__attn_work_shape dllm__attn_varlen_work(const std::vector<int32_t> &q_offsets,
                                                    const std::vector<int32_t> &splits, int br,
                                                    std::vector<int32_t> &items) {
    dllm__attn_work_shape w;
    w.br = br;
    items.clear();
    const int entries = (int)q_offsets.size() - 1;
    auto shares = [&](int e) { return splits.empty() ? 1 : splits[2 * (size_t)e]; };
    for (int e = 0; e < entries; e++) {
        const int tiles = (q_offsets[(size_t)e + 1] - q_offsets[(size_t)e] + br - 1) / br;
        for (int s = 0; s < shares(e); s++)
            for (int t = 0; t < tiles; t++) items.insert(items.end(), {t, e, s, 0}), w.n_attn++;
    }
    for (int e = 0; e < entries; e++) {
        if (shares(e) < 2) continue;
        for (int r = q_offsets[(size_t)e]; r < q_offsets[(size_t)e + 1]; r++)
            items.insert(items.end(), {e, r - q_offsets[(size_t)e]}), w.n_combine++;
    }
    return w;
}

/* The varlen flash_attn over `batch` entries (a.q_offsets, a.kv_offsets): one CTA per head and item of the work list
 * a.varlen_work (dllm__attn_varlen_work, shape w, made for arch's tiles); each entry computed as its own launch would
 * (varlen_sequence). */
static dllm_status dllm__attn_varlen_launch(const dllm__kernel<void(attn_args)> &k,
                                            const dllm__kernel<void(attn_args)> &combine, const dllm__arch &arch,
                                            int hd, int heads, int batch, const dllm__attn_work_shape &w,
                                            const attn_args &a, cudaStream_t s) {
    if (a.fa_mode || (a.kv_splits != 1 && !a.varlen_splits) || a.key_valid || !a.q_offsets || !a.kv_offsets ||
        (w.n_attn && !a.varlen_work) || (w.n_combine && !a.varlen_splits) || w.br != arch.fa_br || heads > 65535)
        return dllm__fail(
            DLLM_ERR_INTERNAL,
            "varlen attention: %d sequences, FACache %d, %d KV splits (shares %s), key mask %s, a work list of %d + %d "
            "items %s for tiles of %d rows (none, -, -, none, -, set, %d expected)",
            batch, a.fa_mode, a.kv_splits, a.varlen_splits ? "set" : "none", a.key_valid ? "set" : "none", w.n_attn,
            w.n_combine, a.varlen_work ? "set" : "none", w.br, arch.fa_br);
    if (w.n_attn == 0) return DLLM_OK;
    const dim3 grid((unsigned)w.n_attn, (unsigned)heads);
    DLLM__TRY(k.launch({grid, dim3((unsigned)dllm__attn_threads(arch)), dllm__attn_smem(hd, arch)}, s, a));
    if (w.n_combine == 0) return DLLM_OK;
    attn_args c = a;
    c.varlen_work = a.varlen_work + 4 * (size_t)w.n_attn;  // the combine's items follow flash_attn's
    return combine.launch({dim3((unsigned)w.n_combine, (unsigned)heads), dim3((unsigned)hd)}, s, c);
}

dllm_status dllm__gpu_backend::init(int device, const dllm__progress &progress) {
    const dllm__config &c = model_.cfg;
    if (c.scale_logits)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend does not implement scale_logits; use the CPU backend");
    if (!dllm__attn_supports(c.head_dim))
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "the GPU backend supports head dimensions that are multiples of 8 from 8 to 256, this model has %d; "
            "use the CPU backend",
            c.head_dim);
    const bool dense_ffn = c.family != DLLM_FAMILY_LLADA2 || c.n_dense_layers > 0;  // a LLaDA2 of MoE layers only
    if (c.n_embd % 8 || (dense_ffn && c.n_ff % 8) || c.n_vocab % 8)
        return dllm__fail(DLLM_ERR_UNSUPPORTED,
                          "the GPU backend needs hidden (%d), MLP (%d) and vocabulary (%d) sizes divisible by 8",
                          c.n_embd, c.n_ff, c.n_vocab);
    if (dllm__round_up(c.n_embd, 128) / 8 > 1024 * dllm__norm_slots)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "the GPU backend supports hidden sizes up to %d, this model has %d",
                          1024 * dllm__norm_slots * 8, c.n_embd);
    if (c.family == DLLM_FAMILY_LLADA2) DLLM__TRY(moe_supported());
    device_ = device;
    DLLM__CUDA(cudaSetDevice(device));
    cudaDeviceProp prop;
    DLLM__CUDA(cudaGetDeviceProperties(&prop, device));
    arch_ = dllm__attn_tiles(dllm__arch_for(prop.major * 10 + prop.minor), c.head_dim);
    n_sms_ = prop.multiProcessorCount;
    smem_per_sm_ = (int)prop.sharedMemPerMultiprocessor;
    if (arch_.cc < 80)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s has compute capability %d.%d; dllm needs 8.0 or newer", prop.name,
                          prop.major, prop.minor);
    DLLM__CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    DLLM__TRY(gemms_.dense.init());
    DLLM__TRY(load_kernels());
    if (moe_model()) DLLM__TRY(load_moe());
    bool fp8_ffn = false, fp8_attn = false;
    DLLM__TRY(choose_precision(prop.name, fp8_ffn, fp8_attn));
    std::shared_ptr<dllm__gpu_weights> w;
    DLLM__TRY(dllm__gpu_weights_for(model_, device, fp8_ffn, fp8_attn, lowbit_.options, kernels_.rowwise,
                                    lowbit_.options.enabled ? &lowbit_.kernels : nullptr, lowbit_.q4wg.get(), progress,
                                    w));
    weights_ = std::move(w);
    if (moe_model()) DLLM__TRY(moe_pointers());  // the experts' device addresses, for the grouped GEMM
    std::vector<float> cos_t, sin_t;
    dllm__rope_tables_cfg(c, max_tokens_, cos_t, sin_t);  // the CPU's tables, YaRN included
    DLLM__TRY(dllm__upload_f32(rope_cos_, cos_t, "RoPE tables"));
    DLLM__TRY(dllm__upload_f32(rope_sin_, sin_t, "RoPE tables"));
    dllm__log(DLLM_LOG_INFO, "GPU backend on %s (sm_%d, %d SMs): attention tile %dx%d (wgmma: 128x%d), %s", prop.name,
              arch_.cc, prop.multiProcessorCount, arch_.fa_br, arch_.fa_bc, arch_.fa_wg_bc,
              lowbit_.options.enabled ? dllm__precision_name(precision_)
              : fp8_attn              ? "FP8 FFN and attention projections in layers >= 1"
              : fp8_ffn               ? "FP8 FFN in layers >= 1"
                                      : "BF16");
    return DLLM_OK;
}

/* The modules compile in parallel: cold JIT time is the slowest one, not the sum. gemm_wg's (sm_90a) compiles beside
 * them; it is only a candidate of the GEMM autotuner, so where it cannot be set up the GEMMs run on cuBLASLt alone,
 * with a warning. So do its 128- and 64-wide variants, which the batched forwards take where faster (batch_gemm_wg). */
dllm_status dllm__gpu_backend::load_kernels() {
    std::shared_ptr<dllm__module> gemm_module, gemm_n128_module, gemm_n64_module, splitk_module;
    const int forced = dllm__env().batch_gemm_n;  // 0: every width is a candidate
    const bool n128 = arch_.gemm_wg_stages && (forced == 0 || forced == 128),
               n64 = arch_.gemm_wg_stages && (forced == 0 || forced == 64);
    std::vector<std::pair<dllm__jit_request, std::shared_ptr<dllm__module> *>> jobs = {
        {dllm__module_rowwise(arch_), &kernels_.rowwise_module},
        {dllm__module_sampler(arch_), &kernels_.sampler_module},
        {dllm__module_attention(arch_, model_.cfg.head_dim), &kernels_.attn_module}};
    if (lowbit_.options.enabled) {
        jobs.push_back({dllm__module_soloq(arch_), &lowbit_.module});
        jobs.push_back({dllm__module_q4_gemm(arch_), &lowbit_.q4_gemm.module});
    }
    const size_t required = jobs.size();  // gemm_wg's module is optional
    if (arch_.gemm_wg_stages) jobs.push_back({dllm__module_gemm_wg(arch_, 256), &gemm_module});
    if (n128) jobs.push_back({dllm__module_gemm_wg(arch_, 128), &gemm_n128_module});
    if (n64) jobs.push_back({dllm__module_gemm_wg(arch_, 64), &gemm_n64_module});
    if (arch_.gemm_wg_stages) jobs.push_back({dllm__module_gemm_splitk(arch_), &splitk_module});
    std::vector<dllm_status> st(jobs.size(), DLLM_OK);
    std::vector<std::string> err(jobs.size());
    std::vector<std::thread> workers;
    for (size_t i = 0; i < jobs.size(); i++)
        workers.emplace_back([&, i] {
            cudaSetDevice(device_);
            st[i] = dllm__jit_load(jobs[i].first, *jobs[i].second);
            if (st[i] != DLLM_OK) err[i] = dllm__tls_error;
        });
    for (std::thread &t : workers) t.join();
    for (size_t i = 0; i < required; i++)
        if (st[i] != DLLM_OK) return dllm__fail(st[i], "%s", err[i].c_str());
    dllm__bind(kernels_.rowwise, *kernels_.rowwise_module);
    dllm__bind(kernels_.sampler, *kernels_.sampler_module);
    DLLM__TRY(dllm__attn_kernels_of(*kernels_.attn_module, arch_, model_.cfg.head_dim, kernels_.attention));
    if (dllm__gemm_wg_load(arch_, 256, gemms_.wg) != DLLM_OK) {
        dllm__log(DLLM_LOG_WARN, "dllm's sm_90a GEMM is not available, BF16 GEMMs run on cuBLASLt alone: %s",
                  dllm__tls_error.c_str());
        gemms_.wg = dllm__gemm_wg();
    }
    if (gemms_.wg.kernel.fn) gemms_.dense.own = &gemms_.wg;
    if (n128 && dllm__gemm_wg_load(arch_, 128, gemms_.wg_n128) != DLLM_OK) {
        dllm__log(DLLM_LOG_WARN, "the 128-wide gemm_wg is not available, batched forwards run the 256-wide one: %s",
                  dllm__tls_error.c_str());
        gemms_.wg_n128 = dllm__gemm_wg();
    }
    if (n64 && dllm__gemm_wg_load(arch_, 64, gemms_.wg_n64) != DLLM_OK) {
        dllm__log(DLLM_LOG_WARN, "the 64-wide gemm_wg is not available, batched forwards choose among the others: %s",
                  dllm__tls_error.c_str());
        gemms_.wg_n64 = dllm__gemm_wg();
    }
    if (arch_.gemm_wg_stages && dllm__gemm_splitk_load(arch_, gemms_.splitk) != DLLM_OK) {
        dllm__log(DLLM_LOG_WARN, "gemm_splitk is not available, BF16 GEMMs run on cuBLASLt and gemm_wg: %s",
                  dllm__tls_error.c_str());
        gemms_.splitk = dllm__gemm_splitk();
    }
    int smem_optin = 0;  // select_commit keeps 5 bytes per canvas position in shared memory
    DLLM__CUDA(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device_));
    DLLM__CUDA(cudaFuncSetAttribute((const void *)kernels_.sampler.select_commit.fn,
                                    cudaFuncAttributeMaxDynamicSharedMemorySize, smem_optin));
    if (lowbit_.options.enabled) {
        DLLM__TRY(dllm__bind(lowbit_.kernels, *lowbit_.module, smem_optin, arch_.cc));
        DLLM__TRY(dllm__q4_gemm_bind(lowbit_.q4_gemm));
    }
    return load_q4wg();
}

/* [W4 GEMM] q4wg where it applies: sm_90a, the activations quantised, integer weight and activation formats (SoloQ-I,
 * RTN-W4A4: q4wg_gemm) or NVFP4 weights and activations (SoloQ-N: q4wg_gemm_nv). A module that does not load leaves
 * the other paths, with one warning. */
dllm_status dllm__gpu_backend::load_q4wg() {
    const dllm__q4_format fw = lowbit_.options.weights, fa = lowbit_.options.acts;
    const bool integer =
        dllm__q4_int_max(fw) && dllm__q4_int_max(fa) && (fw == DLLM__Q4_INT4 || fw == DLLM__Q4_RTN);
    const bool nvfp4 = fw == DLLM__Q4_NVFP4 && fa == DLLM__Q4_NVFP4;
    if (!lowbit_.options.enabled || !lowbit_.options.quantize_acts || !(integer || nvfp4) || arch_.cc != 90 ||
        !dllm__env().q4wg)
        return DLLM_OK;
    std::unique_ptr<dllm__q4wg_kernels> k(new dllm__q4wg_kernels);
    if (dllm__q4wg_load(arch_, *k) != DLLM_OK) {
        dllm__log(DLLM_LOG_WARN, "q4wg is not available, 4-bit GEMMs run on q4_gemm and the INT8 path: %s",
                  dllm__tls_error.c_str());
        return DLLM_OK;
    }
    lowbit_.q4wg = std::move(k);
    return DLLM_OK;
}

/* FP8 runs where the architecture table (or DLLM_TILES fp8_gemm) has an FP8 GEMM; elsewhere BF16, said once. dllm's own
 * kernel is compiled here, only when it will run. */
dllm_status dllm__gpu_backend::choose_precision(const char *gpu_name, bool &fp8_ffn, bool &fp8_attn) {
    if (precision_ == DLLM_PRECISION_BF16 || lowbit_.options.enabled) return DLLM_OK;
    dllm__fp8_gemm mode;
    DLLM__TRY(dllm__fp8_gemm_for(arch_, mode));
    if (mode == DLLM__FP8_NONE) {
        dllm__log(
            DLLM_LOG_WARN,
            "FP8 precision requested, but dllm has no FP8 GEMM for %s (sm_%d; its mma.sync kernel runs on sm_89, "
            "cuBLASLt's "
            "block-scaled FP8 on sm_90, and DLLM_TILES=fp8_gemm=mma forces the kernel on newer GPUs): running BF16",
            gpu_name, arch_.cc);
        return DLLM_OK;
    }
    if (mode == DLLM__FP8_MMA) DLLM__TRY(dllm__fp8_mma_load(arch_, gemms_.fp8_mma));
    dllm__log(DLLM_LOG_INFO, "FP8 GEMMs: %s",
              mode == DLLM__FP8_MMA ? "dllm's mma.sync E4M3 kernel" : "cuBLASLt block-scaled");
    gemms_.fp8 = mode;
    fp8_ffn = true;
    fp8_attn = precision_ == DLLM_PRECISION_FP8_ALL;
    return DLLM_OK;
}

dllm_status dllm__gpu_backend::fit_buffers(int batch, int seq, int lm_rows, bool lacache, bool kv_cache) {
    const dllm__config &c = model_.cfg;
    const size_t M = (size_t)batch * seq, d = (size_t)c.n_embd, qkv = (size_t)(c.n_head + 2 * c.n_head_kv) * c.head_dim;
    // [MoE] ff: the widest FFN input, LLaDA2's shared expert's and experts' too (FP8's and SoloQ's activations)
    const size_t ff = (size_t)std::max(c.n_ff, moe_model() ? std::max(c.n_ff_shared, c.n_ff_expert) : 0);
    const size_t q = (size_t)c.n_head * c.head_dim, rows = (size_t)batch * lm_rows;
    const size_t slices = ((size_t)c.n_vocab + dllm__vocab_slice - 1) / dllm__vocab_slice;
    const bool fp8 = weights_->fp8_ffn || weights_->fp8_attn;
    const size_t Mo = fp8 ? (size_t)act8_rows((int)M) : M;  // an FP8 GEMM writes its padding rows too
    dllm__activations &A = act_;
    const std::vector<const void *> before = A.addresses();
    DLLM__TRY(A.h.fit(M * d * 4, "the residual stream"));
    DLLM__TRY(A.a.fit(M * d * 2, "activations"));
    // An FP8 GEMM writes whole 16-row tiles, and in a cut last layer (forward) a batch entry's rows may start at any
    // row: its padding may run 15 rows past the last real row.
    DLLM__TRY(A.delta.fit((fp8 ? Mo + 16 : M) * d * 2, "activations"));
    DLLM__TRY(A.qkv.fit(Mo * qkv * 2, "Q/K/V"));
    DLLM__TRY(A.att.fit(M * q * 2, "attention output"));
    DLLM__TRY(A.gu.fit(Mo * 2 * ff * 2, "MLP activations"));
    DLLM__TRY(A.f.fit(M * ff * 2, "MLP activations"));
    DLLM__TRY(A.y.fit(M * d * 2, "final norm output"));
    DLLM__TRY(A.h_cut.fit(rows * d * 4, "the residual stream"));
    DLLM__TRY(A.logits.fit(rows * c.n_vocab * 4, "logits"));
    DLLM__TRY(A.partials.fit((size_t)lm_rows * slices * sizeof(conf_partial), "sampler partials"));
    DLLM__TRY(A.x0.fit((size_t)seq * 4, "sampler output"));
    DLLM__TRY(A.conf.fit((size_t)seq * 8, "sampler output"));
    DLLM__TRY(A.deferred.fit((size_t)seq, "sampler output"));
    DLLM__TRY(A.cutoff.fit((size_t)seq * 4, "sampler filters"));
    DLLM__TRY(A.canvas.fit(M * 4, "the canvas"));
    DLLM__TRY(A.is_prompt.fit((size_t)seq, "the canvas"));
    DLLM__TRY(A.state.fit(sizeof(dllm_step_state), "the step state"));
    DLLM__TRY(A.committed.fit((size_t)seq * 4, "the step state"));
    DLLM__TRY(A.positions.fit((size_t)seq * 4, "the RoPE positions"));
    if (gemms_.splitk.module) {  // the widest layer linear's partials; its counters zero, and kept zero
        const std::pair<int, int> shapes[] = {
            {(int)qkv, (int)d}, {(int)d, (int)q}, {2 * (int)ff, (int)d}, {(int)d, (int)ff}};
        size_t words = 0;
        for (const auto &nk : shapes)
            words = std::max(words, dllm__splitk_workspace_floats(
                                        nk.first, dllm__splitk_cut_of(nk.first, nk.second, gemms_.splitk.sm_count)));
        const void *was = A.splitk_ws.ptr;
        DLLM__TRY(A.splitk_ws.fit(words * 4, "gemm_splitk's workspace"));
        if (A.splitk_ws.ptr != was) DLLM__CUDA(cudaMemsetAsync(A.splitk_ws.ptr, 0, A.splitk_ws.bytes, stream_));
    }
    if (kv_cache) {
        A.kv.resize(weights_->layers.size());
        for (dllm__dbuf &b : A.kv) DLLM__TRY(b.fit(M * qkv * 2, "the K/V cache"));
        DLLM__TRY(A.attn_partial.fit((size_t)batch * dllm__attn_partial_bound(arch_, c.head_dim, n_sms_),
                                     "split-KV attention states"));
    }
    if (lacache) {
        const int q_tiles = (seq + arch_.fa_br - 1) / arch_.fa_br, fields = arch_.fa_mt * (4 + c.head_dim / 2);
        DLLM__TRY(A.h0.fit(M * d * 4, "the LaCache embeddings"));
        DLLM__TRY(A.qkv0.fit(M * qkv * 2, "the LaCache Q/K/V"));
        DLLM__TRY(A.fa_state.fit((size_t)batch * c.n_head * q_tiles * fields * dllm__attn_threads(arch_) * 4,
                                 "the LaCache attention state"));
    }
    if (fp8) {
        const size_t k_pad = (size_t)dllm__round_up((int)std::max(std::max(d, ff), q), 128);
        for (auto buf : {std::make_pair(&A.act8, Mo * k_pad), std::make_pair(&A.act8_scale, Mo * (k_pad / 128) * 4)}) {
            const void *was = buf.first->ptr;
            DLLM__TRY(buf.first->fit(buf.second, "FP8 activations"));
            // the padding rows start as zeros: defined inputs for the GEMM rows nobody reads
            if (buf.first->ptr != was) DLLM__CUDA(cudaMemsetAsync(buf.first->ptr, 0, buf.first->bytes, stream_));
        }
        // gemm_fp8_batch's launches of at most pin_m rows over all M rows (act8 and act8_scale above hold them all)
        DLLM__TRY(A.act8_chunk_scale.fit((size_t)dllm__gemm::pin_m * (k_pad / 128) * 4, "FP8 activations"));
    }
    if (weights_->soloq.enabled) {  // the widest input and the largest chunk over the model's linears (gemm_q4)
        const size_t k_max = std::max(std::max(d, ff), q);
        size_t chunk_elems = 0, chunk_rows = 0;
        const size_t ffs = (size_t)std::max(c.n_ff_shared, 8);  // [MoE] LLaDA2's shared expert (gemm_q4's rows paths)
        const std::pair<size_t, size_t> shapes[] = {
            {qkv, d}, {d, q}, {2 * ff, d}, {d, ff}, {(size_t)c.n_vocab, d}, {2 * ffs, d}, {d, ffs}};
        for (const auto &nk : shapes) {
            const size_t rows_at_once = (size_t)dllm__q4_chunk_rows((int)nk.first, (int)nk.second);
            chunk_elems = std::max(chunk_elems, rows_at_once * nk.second),
            chunk_rows = std::max(chunk_rows, rows_at_once);
        }
        DLLM__TRY(A.q4a.fit(M * k_max * 2, "SoloQ activations"));
        DLLM__TRY(A.q4a_scale.fit(M * 4, "SoloQ activations"));
        const bool rows_paths = weights_->q4_rows_linears();  // else q4wg takes every linear: no q4w, q4acc
        if (rows_paths) DLLM__TRY(A.q4w.fit(chunk_elems * 2, "SoloQ weight rows"));
        if (dllm__q4_int_max(lowbit_.options.acts) && dllm__q4_int_max(lowbit_.options.weights) &&
            lowbit_.options.quantize_acts && (M > (size_t)dllm__q4_max_rows || weights_->q4wg))
            DLLM__TRY(A.q4a8.fit(M * k_max, "SoloQ INT8 activations"));
        if (weights_->q4wg) {  // q4wg's split-K sums (NVFP4: chunk partials) and tile counts: zero, and kept zero
            const void *was = A.q4wg_ws.ptr;
            size_t ws = 0;
            if (lowbit_.options.weights != DLLM__Q4_NVFP4) ws = dllm__q4wg_workspace_ints((int)std::max(qkv, 2 * ff));
            else  // the layer linears' (shapes[0..3]; the LM head keeps section 9b's rows)
                for (int i = 0; i < 4; i++)
                    ws = std::max(ws, dllm__q4wg_nv_workspace_ints((int)shapes[i].first, (int)shapes[i].second,
                                                                   (int)std::min<size_t>(M, dllm__q4wg_max_rows)));
            DLLM__TRY(A.q4wg_ws.fit(ws * 4, "q4wg's workspace"));
            if (A.q4wg_ws.ptr != was) DLLM__CUDA(cudaMemsetAsync(A.q4wg_ws.ptr, 0, A.q4wg_ws.bytes, stream_));
        }
        size_t split_k = 0;  // q4_gemm's split-K partials for its most rows
        for (const auto &nk : shapes)
            split_k = std::max(split_k, dllm__q4_gemm_workspace_floats(lowbit_.q4_gemm, dllm__q4_max_rows,
                                                                       (int)nk.first, (int)nk.second));
        if (rows_paths) DLLM__TRY(A.q4acc.fit(std::max(M * chunk_rows, split_k) * 4, "SoloQ GEMM output"));
    }
    size_t pinned = (size_t)seq * 8 + sizeof(dllm_step_state);
    if (pinned > host_pinned_.bytes) {
        if (host_pinned_.ptr) cudaFreeHost(host_pinned_.ptr);
        host_pinned_.ptr = nullptr;
        DLLM__CUDA(cudaMallocHost(&host_pinned_.ptr, pinned));
        host_pinned_.bytes = pinned;
    }
    if (A.addresses() != before) A.generation++;
    if (moe_model()) DLLM__TRY(moe_fit((int)M));  // [MoE] before any capture: a forward never allocates
    return DLLM_OK;
}
