/* src/soloq/precisions.cpp - SoloQ precisions on the CPU: options, quantised weights, the linear hook. */

// ---- SoloQ precisions on the CPU: options, quantised weights, the linear hook -------------------------------

/* How a precision quantises (dllm.h's dllm_precision, with the soloq_rotation and soloq_bias_correction parameters). */
struct dllm__soloq_options {
    bool enabled = false;
    dllm__q4_format weights = DLLM__Q4_NVFP4, acts = DLLM__Q4_NVFP4;
    bool quantize_acts = true;  // false: -w4a16 (activations rotated, not quantised)
    dllm__rot_kind rotation = DLLM__ROT_KRPBH;
    bool bias_correction = true;
    bool quantize_head = false;
    uint64_t seed = 0x50104b52504248ull;  // "SoloKRPBH"-ish: the rotations' Philox key
};

/* A caller's soloq_rotation and soloq_bias_correction (dllm_ctx_params, dllm_quantize_params): `who` names the call. */
static dllm_status dllm__soloq_check_ablation(const char *who, int rotation, int bias_correction) {
    if (rotation < DLLM_SOLOQ_ROTATION_DEFAULT || rotation > DLLM_SOLOQ_ROTATION_HAAR)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "%s: soloq_rotation %d must be a dllm_soloq_rotation (0 to 6)",
                          who, rotation);
    if (bias_correction < -1 || bias_correction > 1)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT, "%s: soloq_bias_correction %d must be -1 (default), 0 or 1", who,
                          bias_correction);
    return DLLM_OK;
}

static bool dllm__precision_is_soloq(int p) { return p >= DLLM_PRECISION_SOLOQ_N && p <= DLLM_PRECISION_RTN_W4A16; }

static const char *dllm__precision_name(int p) {
    static const char *const names[] = {"bf16",          "fp8",           "fp8-all",  "soloq-n",
                                        "soloq-i",       "soloq-c",       "rtn-w4a4", "soloq-n-w4a16",
                                        "soloq-i-w4a16", "soloq-c-w4a16", "rtn-w4a16"};
    return p >= 0 && p <= DLLM_PRECISION_RTN_W4A16 ? names[p] : "(unknown)";
}

/* The options of `precision`; rotation (a dllm_soloq_rotation) and bias_correction (-1: the default) as the caller's
 * parameters ask, both checked by dllm__soloq_check_ablation. */
static dllm_status dllm__soloq_options_for(int precision, int quantize_head, int rotation, int bias_correction,
                                           dllm__soloq_options &o) {
    o = dllm__soloq_options();
    if (!dllm__precision_is_soloq(precision)) return DLLM_OK;
    o.enabled = true;
    o.quantize_head = quantize_head != 0;
    const int base = precision >= DLLM_PRECISION_SOLOQ_N_W4A16 ? precision - 4 : precision;
    o.quantize_acts = precision < DLLM_PRECISION_SOLOQ_N_W4A16;
    static const dllm__q4_format w[] = {DLLM__Q4_NVFP4, DLLM__Q4_INT4, DLLM__Q4_E8P, DLLM__Q4_RTN},
                                 a[] = {DLLM__Q4_NVFP4, DLLM__Q4_INT4, DLLM__Q4_LLOYD, DLLM__Q4_RTN};
    o.weights = w[base - DLLM_PRECISION_SOLOQ_N];
    o.acts = a[base - DLLM_PRECISION_SOLOQ_N];
    if (base == DLLM_PRECISION_RTN_W4A4) {  // the baseline is fixed: no rotation, no correction
        o.rotation = DLLM__ROT_NONE;
        o.bias_correction = false;
        return DLLM_OK;
    }
    if (rotation != DLLM_SOLOQ_ROTATION_DEFAULT) o.rotation = (dllm__rot_kind)(rotation - 1);
    if (bias_correction >= 0) o.bias_correction = bias_correction == 1;
    return DLLM_OK;
}

/* One quantised linear: the rows of W R^T (each weight row rotated by its input site's R) in 4 bits. */
struct dllm__soloq_linear {
    dllm__q4_rows w;
    std::shared_ptr<const dllm__rotation> rot;
};

/* The quantised linears of one layer by site (Q|K|V and gate|up stacked by rows, as the GPU fuses them), or the LM
 * head alone at DLLM__SOLOQ_HEAD; a LLaDA2 MoE layer's routed experts (GU and DOWN hold its shared expert); and how
 * activations are treated. */
struct dllm__soloq_layer {
    dllm__soloq_linear lin[DLLM__SOLOQ_SITES];
    std::vector<dllm__soloq_linear> expert_gu, expert_down;
    dllm__soloq_options opt;
    /* The linear at site, of routed expert `expert` (sites GU and DOWN) or the layer's own (-1). */
    dllm__soloq_linear &linear(int site, int expert) {
        if (expert < 0) return lin[site];
        return (site == DLLM__SOLOQ_GU ? expert_gu : expert_down)[(size_t)expert];
    }
    const dllm__soloq_linear &linear(int site, int expert) const {
        return const_cast<dllm__soloq_layer *>(this)->linear(site, expert);
    }
    template <class F> void each_linear(F f) const {
        for (const dllm__soloq_linear &l : lin) f(l);
        for (const dllm__soloq_linear &l : expert_gu) f(l);
        for (const dllm__soloq_linear &l : expert_down) f(l);
    }
};

/* Rotation sites are numbered layer * 8 + site (the head: layer n_layer), keying each site's own P, D, Q. */
static uint32_t dllm__soloq_site_id(size_t layer, int site) { return (uint32_t)(layer * 8 + (size_t)site); }

/* Stacks tensors by rows in their BF16 values (what the GPU holds), rotates every row by rot and quantises it. */
static dllm__soloq_linear dllm__soloq_quantize_linear(dllm__pool &pool, const std::vector<const dllm__tensor *> &parts,
                                                      std::shared_ptr<const dllm__rotation> rot,
                                                      const dllm__soloq_options &o) {
    int rows = 0, cols = 0;
    std::vector<float> w = dllm__stack_bf16(parts, rows, cols);
    pool.run(rows, [&](int r) {
        std::vector<float> tmp((size_t)cols);
        dllm__rotate(*rot, w.data() + (size_t)r * cols, tmp.data());
        memcpy(w.data() + (size_t)r * cols, tmp.data(), sizeof(float) * cols);
    });
    dllm__soloq_linear lin;
    lin.w = dllm__q4_quantize(&pool, o.weights, w.data(), rows, cols, o.bias_correction);
    lin.rot = rot;
    return lin;
}

/* Every dimension SoloQ quantises along must hold whole E8P groups of 8 (and be small enough for a dense Haar). */
static dllm_status dllm__soloq_check_dims(const dllm__config &c, const dllm__soloq_options &o) {
    std::vector<int> dims = {c.n_embd, c.n_head * c.head_dim};
    const bool moe = c.family == DLLM_FAMILY_LLADA2;
    if (!moe || c.n_dense_layers > 0) dims.push_back(c.n_ff);
    if (moe) dims.push_back(c.n_ff_expert);
    if (moe && c.n_ff_shared > 0) dims.push_back(c.n_ff_shared);
    for (int d : dims) {
        if (d % 8)
            return dllm__fail(
                DLLM_ERR_UNSUPPORTED,
                "SoloQ precisions need every linear's input width to be a multiple of 8; this model has %d", d);
        if (o.rotation == DLLM__ROT_HAAR && d > dllm__haar_max_d)
            return dllm__fail(
                DLLM_ERR_UNSUPPORTED,
                "soloq_rotation haar (--soloq-rotation haar) builds dense rotations of at most %d dimensions; this "
                "model has %d (use krpbh)",
                dllm__haar_max_d, d);
    }
    return DLLM_OK;
}

/* Storage of SoloQ weights in bytes (codes + block scales + row scales), as the GPU will hold them. */
static size_t dllm__soloq_bytes(const dllm__soloq_layer &q) {
    size_t n = 0;
    q.each_linear([&](const dllm__soloq_linear &l) {
        n += l.w.codes.size() + l.w.block_scales.size() + 4 * l.w.row_scale.size();
    });
    return n;
}

/* The rotation of a site (its input width d); the head's layer is n_layer. */
static std::shared_ptr<const dllm__rotation> dllm__soloq_site_rotation(const dllm__soloq_options &o, size_t layer,
                                                                       int site, int d) {
    return std::make_shared<const dllm__rotation>(
        dllm__make_rotation(o.rotation, d, o.seed, dllm__soloq_site_id(layer, site)));
}

/* Layer l's rotations, one per site and input width, each built once: every linear of a site reads the same input
 * (all of a MoE layer's gate|up linears, shared and routed, read the normed row: a token is rotated once), and the
 * routed experts' down linears share one R of their width (one rotation over all their rows, as a grouped GEMM's). */
struct dllm__soloq_rotations {
    const dllm__soloq_options &o;
    size_t layer;
    std::map<std::pair<int, int>, std::shared_ptr<const dllm__rotation>> made;
    std::shared_ptr<const dllm__rotation> of(int site, int d) {
        std::shared_ptr<const dllm__rotation> &r = made[{site, d}];
        if (!r) r = dllm__soloq_site_rotation(o, layer, site, d);
        return r;
    }
};

/* Rows and columns of a site's stacked weight (Q|K|V and gate|up by rows) in layer l, of routed expert `expert` or the
 * layer's own (-1: the MLP, or in a MoE layer the shared expert: 0 rows where there is none). */
static void dllm__soloq_site_shape(const dllm__config &c, int layer, int site, int expert, int &rows, int &cols) {
    const int q = c.n_head * c.head_dim, kv = c.n_head_kv * c.head_dim;
    const int ff = expert >= 0 ? c.n_ff_expert : dllm__is_moe_layer(c, (size_t)layer) ? c.n_ff_shared : c.n_ff;
    switch (site) {
        case DLLM__SOLOQ_QKV: rows = q + 2 * kv, cols = c.n_embd; break;
        case DLLM__SOLOQ_O: rows = c.n_embd, cols = q; break;
        case DLLM__SOLOQ_GU: rows = 2 * ff, cols = c.n_embd; break;
        case DLLM__SOLOQ_DOWN: rows = ff ? c.n_embd : 0, cols = ff; break;
        default: rows = c.n_vocab, cols = c.n_embd; break;
    }
}

/* Layer l's quantised linears as (site, expert) in file order: Q|K|V, O, the layer's own gate|up and down (absent in a
 * MoE layer without a shared expert), then each routed expert's gate|up and down. */
static std::vector<std::pair<int, int>> dllm__soloq_layer_linears(const dllm__config &c, int layer) {
    std::vector<std::pair<int, int>> out = {{DLLM__SOLOQ_QKV, -1}, {DLLM__SOLOQ_O, -1}};
    const bool moe = dllm__is_moe_layer(c, (size_t)layer);
    if (!moe || c.n_ff_shared > 0) out.insert(out.end(), {{DLLM__SOLOQ_GU, -1}, {DLLM__SOLOQ_DOWN, -1}});
    for (int e = 0; moe && e < c.n_expert; e++) out.insert(out.end(), {{DLLM__SOLOQ_GU, e}, {DLLM__SOLOQ_DOWN, e}});
    return out;
}

/* An empty quantised layer l under options o, with room for its routed experts. */
static std::shared_ptr<dllm__soloq_layer> dllm__soloq_layer_for(const dllm__config &c, int layer,
                                                                const dllm__soloq_options &o) {
    std::shared_ptr<dllm__soloq_layer> q = std::make_shared<dllm__soloq_layer>();
    q->opt = o;
    if (dllm__is_moe_layer(c, (size_t)layer))
        q->expert_gu.resize((size_t)c.n_expert), q->expert_down.resize((size_t)c.n_expert);
    return q;
}

/* The BF16 tensors of one quantised linear of layer L, stacked by rows. */
static std::vector<const dllm__tensor *> dllm__soloq_site_parts(const dllm__layer_weights &L, int site, int expert) {
    const std::array<const dllm__tensor *, 3> ffn = dllm__ffn_parts(L);
    const size_t e = (size_t)expert;
    switch (site) {
        case DLLM__SOLOQ_QKV: return dllm__qkv_parts(L);
        case DLLM__SOLOQ_O: return {L.wo};
        case DLLM__SOLOQ_GU:
            if (expert >= 0) return {L.expert_gate[e], L.expert_up[e]};
            return {ffn[0], ffn[1]};
        default:
            if (expert >= 0) return {L.expert_down[e]};
            return {ffn[2]};
    }
}

/* Layer l's linears quantised from the model's BF16 tensors. */
static std::shared_ptr<const dllm__soloq_layer> dllm__soloq_quantize_layer(const dllm_model &m, dllm__pool &pool,
                                                                           const dllm__soloq_options &o, size_t l) {
    const dllm__config &c = m.cfg;
    std::shared_ptr<dllm__soloq_layer> q = dllm__soloq_layer_for(c, (int)l, o);
    dllm__soloq_rotations rot{o, l, {}};
    for (const std::pair<int, int> &lin : dllm__soloq_layer_linears(c, (int)l)) {
        int rows = 0, cols = 0;
        dllm__soloq_site_shape(c, (int)l, lin.first, lin.second, rows, cols);
        q->linear(lin.first, lin.second) = dllm__soloq_quantize_linear(
            pool, dllm__soloq_site_parts(m.layers[l], lin.first, lin.second), rot.of(lin.first, cols), o);
    }
    return q;
}

/* The LM head quantised from the model's BF16 head (at lin[DLLM__SOLOQ_HEAD]). */
static std::shared_ptr<const dllm__soloq_layer> dllm__soloq_quantize_head(const dllm_model &m, dllm__pool &pool,
                                                                          const dllm__soloq_options &o) {
    std::shared_ptr<dllm__soloq_layer> h = std::make_shared<dllm__soloq_layer>();
    h->opt = o;
    h->lin[DLLM__SOLOQ_HEAD] = dllm__soloq_quantize_linear(
        pool, {m.head}, dllm__soloq_site_rotation(o, m.layers.size(), DLLM__SOLOQ_HEAD, m.cfg.n_embd), o);
    return h;
}

/* [quantised checkpoints] What a directory written by dllm_model_quantize holds (dllm_model::soloq): every layer's
 * SoloQ linears as dllm__soloq_quantize_layer makes them (codes, block scales and row scales read from the file, the
 * rotations rebuilt from (kind, d, seed, site)), the head's if it was quantised, and the options they were made with
 * (opt.quantize_acts: the recorded precision's; a -W4A16 context copies the layers with its own). */
struct dllm__soloq_store {
    int precision = DLLM_PRECISION_BF16;  // as recorded (dllm.precision)
    dllm__soloq_options opt;
    std::vector<std::shared_ptr<const dllm__soloq_layer>> layers;
    std::shared_ptr<const dllm__soloq_layer> head;  // null: the head stays BF16
};

/* The options a context on model m quantises with: on a quantised checkpoint the stored rotation, seed and correction
 * (the activations must meet the weights in their basis), and the head quantised when the file holds it. */
static dllm__soloq_options dllm__soloq_effective_options(const dllm_model &m, const dllm__soloq_options &asked) {
    if (!m.soloq) return asked;
    dllm__soloq_options o = m.soloq->opt;
    o.quantize_acts = asked.quantize_acts;
    o.quantize_head = asked.quantize_head || m.soloq->head;
    return o;
}

/* A stored layer under a context's options: shared as it is, or (another activation treatment) copied. */
static std::shared_ptr<const dllm__soloq_layer> dllm__soloq_stored(const std::shared_ptr<const dllm__soloq_layer> &q,
                                                                   const dllm__soloq_options &o) {
    if (q->opt.quantize_acts == o.quantize_acts) return q;
    std::shared_ptr<dllm__soloq_layer> copy = std::make_shared<dllm__soloq_layer>(*q);
    copy->opt = o;
    return copy;
}

/* Weights of every layer (and the head if asked) quantised once at context creation, or taken from a quantised
 * checkpoint (dllm_model::soloq); layer l's entry points at its SoloQ linears. *head: the quantised LM head or null.
 * progress counts the quantised layers and head (none from a quantised checkpoint). */
static std::vector<dllm__fp8_layer> dllm__cpu_soloq_weights(const dllm_model &m, dllm__pool &pool,
                                                            const dllm__soloq_options &asked,
                                                            std::shared_ptr<const dllm__soloq_layer> &head,
                                                            const dllm__progress &progress = dllm__progress()) {
    const dllm__config &c = m.cfg;
    const dllm__soloq_options o = dllm__soloq_effective_options(m, asked);
    const int total = (int)m.layers.size() + (o.quantize_head ? 1 : 0);
    std::vector<dllm__fp8_layer> out(m.layers.size());
    for (size_t l = 0; l < m.layers.size(); l++) {
        if (m.soloq) {
            out[l].soloq = dllm__soloq_stored(m.soloq->layers[l], o);
            continue;
        }
        out[l].soloq = dllm__soloq_quantize_layer(m, pool, o, l);
        progress.report((int)l + 1, total);
    }
    head.reset();
    if (m.soloq && m.soloq->head) {
        head = dllm__soloq_stored(m.soloq->head, o);
    } else if (o.quantize_head) {
        head = dllm__soloq_quantize_head(m, pool, o);
        if (!m.soloq) progress.report(total, total);
    }
    size_t bytes = head ? dllm__soloq_bytes(*head) : 0,
           weights = head ? (size_t)head->lin[DLLM__SOLOQ_HEAD].w.rows * c.n_embd : 0;
    for (const dllm__fp8_layer &l : out) {
        bytes += dllm__soloq_bytes(*l.soloq);
        l.soloq->each_linear([&](const dllm__soloq_linear &lin) { weights += (size_t)lin.w.rows * lin.w.cols; });
    }
    dllm__log(
        DLLM_LOG_INFO,
        "SoloQ: %s weights%s, %s activations, rotation %s, bias correction %s, LM head %s: %.1f MB, %.3f bits a weight",
        dllm__q4_names[o.weights], m.soloq ? " (stored)" : "", o.quantize_acts ? dllm__q4_names[o.acts] : "unquantised",
        dllm__rot_names[o.rotation], o.bias_correction ? "on" : "off", o.quantize_head ? "quantised" : "BF16",
        bytes / 1e6, 8.0 * bytes / std::max<size_t>(weights, 1));
    return out;
}

/* The input of a SoloQ linear, in place: each row rotated by the linear's R, then (W4A4) quantised and dequantised
 * per token. */
static void dllm__soloq_prepare_input(dllm__pool &pool, const dllm__soloq_linear &lin, const dllm__soloq_options &o,
                                      float *x, int T) {
    const int K = lin.w.cols;
    pool.run(T, [&](int t) {
        float *xr = x + (size_t)t * K;
        std::vector<float> tmp((size_t)K);
        dllm__rotate(*lin.rot, xr, tmp.data());
        if (o.quantize_acts) dllm__q4_fake_quantize(o.acts, tmp.data(), 1, K, o.bias_correction);
        memcpy(xr, tmp.data(), sizeof(float) * K);
    });
}

/* The hook of the CPU forward (declared in cpu/fp8.cpp): y[T][N] = x . W[row0 .. row0 + N)^T (+ bias) on the quantised
 * weight at site (of routed expert `expert`, or the layer's own: -1); with prepare_x, x is first rotated and quantised
 * in place (the later calls on the same input, K and V after Q, up after gate, pass false). */
static void dllm__cpu_linear_soloq(dllm__pool &pool, float *x, bool prepare_x, int T, const dllm__soloq_layer &q,
                                   int site, int row0, const float *bias, int N, float *y, int expert) {
    const dllm__soloq_linear &lin = q.linear(site, expert);
    if (prepare_x) dllm__soloq_prepare_input(pool, lin, q.opt, x, T);
    dllm__cpu_linear_rows(
        pool, x, T, lin.w.cols, [&](int n, float *dst) { dllm__q4_row(lin.w, row0 + n, dst); }, bias, N, y);
}
