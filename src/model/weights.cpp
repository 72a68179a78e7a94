/* src/model/weights.cpp - the expected tensors of a model, bound and loaded (dllm_model). */

// ---------------------------------------------------------------------------------------------------
// 5. Weights: expected tensors, binding, loading
// ---------------------------------------------------------------------------------------------------

enum dllm__wkind {
    DLLM__W_EMBED,
    DLLM__W_ATTN_NORM,
    DLLM__W_Q,
    DLLM__W_K,
    DLLM__W_V,
    DLLM__W_BQ,
    DLLM__W_BK,
    DLLM__W_BV,
    DLLM__W_O,
    DLLM__W_FFN_NORM,
    DLLM__W_GATE,
    DLLM__W_UP,
    DLLM__W_DOWN,
    DLLM__W_FINAL_NORM,
    DLLM__W_HEAD,
    // LLaDA2 (model/llada2.cpp)
    DLLM__W_QKV,  // fused Q|K|V rows
    DLLM__W_Q_NORM,
    DLLM__W_K_NORM,
    DLLM__W_ROUTER,
    DLLM__W_EXPERT_BIAS,
    DLLM__W_EXPERT_GATE,
    DLLM__W_EXPERT_UP,
    DLLM__W_EXPERT_DOWN,
    DLLM__W_SHARED_GATE,
    DLLM__W_SHARED_UP,
    DLLM__W_SHARED_DOWN
};

struct dllm__wspec {
    std::string name;
    std::vector<int64_t> shape;
    int layer;  // -1 for model-level tensors
    dllm__wkind kind;
    int expert = -1;  // DLLM__W_EXPERT_*: which routed expert
};

static std::vector<dllm__wspec> dllm__llada2_expected_weights(const dllm__config &c);  // model/llada2.cpp

/* Every tensor the config demands, with its HF name and PyTorch shape [out, in]. */
static std::vector<dllm__wspec> dllm__expected_weights(const dllm__config &c) {
    const int64_t d = c.n_embd, q = (int64_t)c.n_head * c.head_dim, kv = (int64_t)c.n_head_kv * c.head_dim, ff = c.n_ff;
    if (c.family == DLLM_FAMILY_LLADA2) return dllm__llada2_expected_weights(c);
    const bool llada = c.family == DLLM_FAMILY_LLADA;
    const std::string qwen = c.family == DLLM_FAMILY_NEMOTRON_DIFFUSION ? "encoder." : "model.";  // Nemotron: encoder.*
    std::vector<dllm__wspec> w;
    w.push_back(
        {llada ? "model.transformer.wte.weight" : qwen + "embed_tokens.weight", {c.n_vocab, d}, -1, DLLM__W_EMBED});
    for (int l = 0; l < c.n_layer; l++) {
        std::string p = llada ? dllm__format("model.transformer.blocks.%d.", l) : qwen + dllm__format("layers.%d.", l);
        std::string attn = llada ? p : p + "self_attn.", mlp = llada ? p : p + "mlp.";
        w.push_back({p + (llada ? "attn_norm.weight" : "input_layernorm.weight"), {d}, l, DLLM__W_ATTN_NORM});
        w.push_back({attn + "q_proj.weight", {q, d}, l, DLLM__W_Q});
        w.push_back({attn + "k_proj.weight", {kv, d}, l, DLLM__W_K});
        w.push_back({attn + "v_proj.weight", {kv, d}, l, DLLM__W_V});
        if (c.qkv_bias) {
            w.push_back({attn + "q_proj.bias", {q}, l, DLLM__W_BQ});
            w.push_back({attn + "k_proj.bias", {kv}, l, DLLM__W_BK});
            w.push_back({attn + "v_proj.bias", {kv}, l, DLLM__W_BV});
        }
        w.push_back({attn + (llada ? "attn_out.weight" : "o_proj.weight"), {d, q}, l, DLLM__W_O});
        w.push_back({p + (llada ? "ff_norm.weight" : "post_attention_layernorm.weight"), {d}, l, DLLM__W_FFN_NORM});
        w.push_back({mlp + (llada ? "ff_proj.weight" : "gate_proj.weight"), {ff, d}, l, DLLM__W_GATE});
        w.push_back({mlp + "up_proj.weight", {ff, d}, l, DLLM__W_UP});
        w.push_back({mlp + (llada ? "ff_out.weight" : "down_proj.weight"), {d, ff}, l, DLLM__W_DOWN});
    }
    w.push_back({llada ? "model.transformer.ln_f.weight" : qwen + "norm.weight", {d}, -1, DLLM__W_FINAL_NORM});
    const char *head = llada                                        ? "model.transformer.ff_out.weight"
                       : c.family == DLLM_FAMILY_NEMOTRON_DIFFUSION ? "diffusion_head.weight"
                                                                    : "lm_head.weight";
    if (!c.tied_embeddings) w.push_back({head, {c.n_vocab, d}, -1, DLLM__W_HEAD});
    return w;
}

struct dllm__layer_weights {
    const dllm__tensor *wq = nullptr, *wk = nullptr, *wv = nullptr, *wo = nullptr;
    const dllm__tensor *gate = nullptr, *up = nullptr, *down = nullptr;
    std::vector<float> attn_norm, ffn_norm, bq, bk, bv;  // small vectors, kept in fp32
    // LLaDA2: fused Q|K|V, QK-norm; a MoE layer's router and experts (its gate/up/down are null)
    const dllm__tensor *wqkv = nullptr;
    std::vector<float> q_norm, k_norm;  // [head_dim], shared by the heads
    const dllm__tensor *router = nullptr;
    std::vector<float> expert_bias;  // [n_expert]: added to the routing scores for selection only
    std::vector<const dllm__tensor *> expert_gate, expert_up, expert_down;
    const dllm__tensor *shared_gate = nullptr, *shared_up = nullptr, *shared_down = nullptr;
};

struct dllm__gpu_weights;
struct dllm__soloq_store;
}  // namespace
struct dllm_model {
    dllm__config cfg;
    std::string dir;
    std::vector<std::unique_ptr<dllm__safetensors>> files;
    std::unordered_map<std::string, const dllm__tensor *> by_name;
    const dllm__tensor *embed = nullptr, *head = nullptr;
    std::vector<float> final_norm;
    std::vector<dllm__layer_weights> layers;
    int64_t n_params = 0;
    // [quantised checkpoints] a directory written by dllm_model_quantize: the stored SoloQ linears (section 9b); the
    // BF16 tensors they replace are absent (their dllm__layer_weights pointers, and head if the head is stored, are
    // null)
    std::shared_ptr<const dllm__soloq_store> soloq;
    bool random_weights = false;  // dllm_model_load_random: weights are generated on the GPU
    uint64_t random_seed = 0;
    // [shared weights] the device copies (section 16.2): built by the first context on a device and weight format,
    // shared by the rest
    mutable std::mutex gpu_weights_mutex;
    mutable std::vector<std::weak_ptr<dllm__gpu_weights>> gpu_weights;
};
namespace {

/* Element i of a float tensor (BF16/F16/F32), read bytewise: mapped data need not be aligned. */
static inline float dllm__tensor_at(const dllm__tensor &t, int64_t i) {
    switch (t.dtype) {
        case DLLM__BF16: {
            uint16_t b;
            memcpy(&b, t.data + 2 * i, 2);
            return dllm__bf16_to_f32(b);
        }
        case DLLM__F16: {
            uint16_t b;
            memcpy(&b, t.data + 2 * i, 2);
            return dllm__f16_to_f32(b);
        }
        default: {
            float f;
            memcpy(&f, t.data + 4 * i, 4);
            return f;
        }
    }
}

static void dllm__tensor_row(const dllm__tensor &t, int64_t row, int64_t width, float *dst) {
    for (int64_t k = 0; k < width; k++) dst[k] = dllm__tensor_at(t, row * width + k);
}

static std::vector<float> dllm__tensor_f32(const dllm__tensor &t) {
    std::vector<float> v((size_t)t.numel);
    dllm__tensor_row(t, 0, t.numel, v.data());
    return v;
}

static dllm_status dllm__check_tensor(const dllm__wspec &spec, const dllm__tensor *t) {
    if (!t)
        return dllm__fail(DLLM_ERR_SHAPE, "missing tensor %s (expected shape %s)", spec.name.c_str(),
                          dllm__shape_str(spec.shape).c_str());
    if (t->shape != spec.shape)
        return dllm__fail(DLLM_ERR_SHAPE, "%s: tensor %s: expected shape %s, found %s", t->file->c_str(),
                          spec.name.c_str(), dllm__shape_str(spec.shape).c_str(), dllm__shape_str(t->shape).c_str());
    if (t->dtype != DLLM__BF16 && t->dtype != DLLM__F16 && t->dtype != DLLM__F32)
        return dllm__fail(DLLM_ERR_UNSUPPORTED, "%s: tensor %s has dtype %s; dllm reads BF16, F16 and F32",
                          t->file->c_str(), spec.name.c_str(), dllm__dtypes[t->dtype].name);
    return DLLM_OK;
}

static void dllm__bind_tensor(dllm_model &m, const dllm__wspec &spec, const dllm__tensor *t) {
    dllm__layer_weights *L = spec.layer >= 0 ? &m.layers[(size_t)spec.layer] : nullptr;
    switch (spec.kind) {
        case DLLM__W_EMBED: m.embed = t; break;
        case DLLM__W_HEAD: m.head = t; break;
        case DLLM__W_FINAL_NORM: m.final_norm = dllm__tensor_f32(*t); break;
        case DLLM__W_ATTN_NORM: L->attn_norm = dllm__tensor_f32(*t); break;
        case DLLM__W_FFN_NORM: L->ffn_norm = dllm__tensor_f32(*t); break;
        case DLLM__W_BQ: L->bq = dllm__tensor_f32(*t); break;
        case DLLM__W_BK: L->bk = dllm__tensor_f32(*t); break;
        case DLLM__W_BV: L->bv = dllm__tensor_f32(*t); break;
        case DLLM__W_Q: L->wq = t; break;
        case DLLM__W_K: L->wk = t; break;
        case DLLM__W_V: L->wv = t; break;
        case DLLM__W_O: L->wo = t; break;
        case DLLM__W_GATE: L->gate = t; break;
        case DLLM__W_UP: L->up = t; break;
        case DLLM__W_DOWN: L->down = t; break;
        case DLLM__W_QKV: L->wqkv = t; break;
        case DLLM__W_Q_NORM: L->q_norm = dllm__tensor_f32(*t); break;
        case DLLM__W_K_NORM: L->k_norm = dllm__tensor_f32(*t); break;
        case DLLM__W_ROUTER: L->router = t; break;
        case DLLM__W_EXPERT_BIAS: L->expert_bias = dllm__tensor_f32(*t); break;
        case DLLM__W_EXPERT_GATE: L->expert_gate[(size_t)spec.expert] = t; break;
        case DLLM__W_EXPERT_UP: L->expert_up[(size_t)spec.expert] = t; break;
        case DLLM__W_EXPERT_DOWN: L->expert_down[(size_t)spec.expert] = t; break;
        case DLLM__W_SHARED_GATE: L->shared_gate = t; break;
        case DLLM__W_SHARED_UP: L->shared_up = t; break;
        case DLLM__W_SHARED_DOWN: L->shared_down = t; break;
    }
}

/* A tensor by its expected name; Nemotron's head may also be stored as lm_head.weight (models.md 4.3). */
static const dllm__tensor *dllm__find_weight(const dllm_model &m, const dllm__wspec &spec, std::string &found_name) {
    found_name = spec.name;
    auto it = m.by_name.find(spec.name);
    if (it == m.by_name.end() && spec.name == "diffusion_head.weight")
        it = m.by_name.find(found_name = "lm_head.weight");
    return it == m.by_name.end() ? nullptr : it->second;
}

/* gemma_rms norms compute x * (1 + w): folding the 1 into the weights keeps one norm everywhere. */
static void dllm__fold_gemma_norms(dllm_model &m) {
    auto fold = [](std::vector<float> &w) {
        for (float &x : w) x += 1.0f;
    };
    fold(m.final_norm);
    for (dllm__layer_weights &L : m.layers) {
        fold(L.attn_norm);
        fold(L.ffn_norm);
    }
}

// [quantised checkpoints] (section 9b): the stored linears are read before the BF16 tensors are bound.
static dllm_status dllm__soloq_load_store(dllm_model &m);
static bool dllm__soloq_replaces(const dllm_model &m, dllm__wkind kind);
static bool dllm__soloq_tensor_name(const std::string &name);

/* Resolves every expected tensor; missing, misshapen or wrongly typed tensors are errors. */
static dllm_status dllm__bind_weights(dllm_model &m) {
    const dllm__config &c = m.cfg;
    m.layers.assign((size_t)c.n_layer, dllm__layer_weights());
    for (dllm__layer_weights &L : m.layers)  // LLaDA2's routed experts (none elsewhere)
        L.expert_gate.assign((size_t)c.n_expert, nullptr), L.expert_up = L.expert_gate, L.expert_down = L.expert_gate;
    std::vector<dllm__wspec> specs = dllm__expected_weights(c);
    std::unordered_set<std::string> used;
    for (const dllm__wspec &spec : specs) {
        if (dllm__soloq_replaces(m, spec.kind)) continue;  // counted by dllm__soloq_load_store
        std::string name;
        const dllm__tensor *t = dllm__find_weight(m, spec, name);
        DLLM__TRY(dllm__check_tensor(spec, t));
        dllm__bind_tensor(m, spec, t);
        used.insert(name);
        m.n_params += t->numel;
    }
    if (c.tied_embeddings) m.head = m.embed;
    if (c.gemma_norm) dllm__fold_gemma_norms(m);
    std::vector<std::string> extra;
    for (auto &kv : m.by_name)
        if (!used.count(kv.first) && !(m.soloq && dllm__soloq_tensor_name(kv.first))) extra.push_back(kv.first);
    if (!extra.empty()) {
        std::sort(extra.begin(), extra.end());
        dllm__log(DLLM_LOG_WARN, "%zu tensor(s) in the checkpoint are not used by the model, e.g. %s", extra.size(),
                  extra[0].c_str());
    }
    return DLLM_OK;
}

static dllm_status dllm__add_file_tensors(dllm_model &m, std::unique_ptr<dllm__safetensors> st) {
    for (const dllm__tensor &t : st->tensors) {
        if (!m.by_name.emplace(t.name, &t).second)
            return dllm__fail(DLLM_ERR_FORMAT, "tensor %s appears in %s and in %s", t.name.c_str(),
                              m.by_name[t.name]->file->c_str(), t.file->c_str());
    }
    m.files.push_back(std::move(st));
    return DLLM_OK;
}

/* Shard names come from an untrusted index: a plain file name in the model directory only. */
static bool dllm__safe_shard_name(const std::string &s) {
    return !s.empty() && s.find('/') == std::string::npos && s.find('\\') == std::string::npos && s != "." && s != "..";
}

/* model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: shard file}}. */
static dllm_status dllm__parse_index(const dllm__json &root, const std::string &path,
                                     std::vector<std::pair<std::string, std::string>> &map) {
    const dllm__json *wm = root.find("weight_map");
    if (root.kind != dllm__json::OBJ || !wm || wm->kind != dllm__json::OBJ)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: missing \"weight_map\" object", path.c_str());
    std::unordered_set<std::string> seen;
    for (size_t i = 0; i < wm->keys.size(); i++) {
        const dllm__json &f = wm->items[i];
        if (f.kind != dllm__json::STR || !dllm__safe_shard_name(f.str))
            return dllm__fail(DLLM_ERR_FORMAT, "%s: weight_map[\"%s\"] must be a file name in the model directory",
                              path.c_str(), wm->keys[i].c_str());
        if (!seen.insert(wm->keys[i]).second)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s is listed twice", path.c_str(), wm->keys[i].c_str());
        map.push_back({wm->keys[i], f.str});
    }
    return DLLM_OK;
}

static dllm_status dllm__load_sharded(dllm_model &m, const std::string &index_path, bool use_mmap) {
    dllm__json root;
    DLLM__TRY(dllm__json_load(index_path, root));
    std::vector<std::pair<std::string, std::string>> map;
    DLLM__TRY(dllm__parse_index(root, index_path, map));
    std::vector<std::string> shards;
    for (auto &e : map)
        if (std::find(shards.begin(), shards.end(), e.second) == shards.end()) shards.push_back(e.second);
    for (const std::string &shard : shards) {
        std::unique_ptr<dllm__safetensors> st(new dllm__safetensors);
        DLLM__TRY(dllm__st_open(dllm__join_path(m.dir, shard.c_str()), use_mmap, *st));
        DLLM__TRY(dllm__add_file_tensors(m, std::move(st)));
    }
    for (auto &e : map) {
        auto it = m.by_name.find(e.first);
        if (it == m.by_name.end() || it->second->file->size() < e.second.size() ||
            it->second->file->compare(it->second->file->size() - e.second.size(), e.second.size(), e.second) != 0)
            return dllm__fail(DLLM_ERR_FORMAT, "%s: tensor %s is mapped to %s but that shard does not hold it",
                              index_path.c_str(), e.first.c_str(), e.second.c_str());
    }
    return DLLM_OK;
}

static dllm_status dllm__load_model(const char *dir, const dllm_model_params &params,
                                    std::unique_ptr<dllm_model> &out) {
    std::unique_ptr<dllm_model> m(new dllm_model);
    m->dir = dir;
    std::string cfg_path = dllm__join_path(m->dir, "config.json");
    DLLM__TRY(dllm__check_model_dir(dir));
    if (!dllm__file_exists(cfg_path)) return dllm__fail(DLLM_ERR_IO, "%s: no config.json in this directory", dir);
    dllm__json cfg_json;
    DLLM__TRY(dllm__json_load(cfg_path, cfg_json));
    DLLM__TRY(dllm__config_parse(cfg_json, cfg_path, m->cfg));
    DLLM__TRY(dllm__find_eot(m->dir, m->cfg));
    DLLM__TRY(dllm__find_bos(m->dir, m->cfg));
    DLLM__TRY(dllm__find_block_tokens(m->dir, m->cfg));
    std::string single = dllm__join_path(m->dir, "model.safetensors"), index = single + ".index.json";
    if (dllm__file_exists(index)) {
        DLLM__TRY(dllm__load_sharded(*m, index, params.use_mmap != 0));
    } else if (dllm__file_exists(single)) {
        std::unique_ptr<dllm__safetensors> st(new dllm__safetensors);
        DLLM__TRY(dllm__st_open(single, params.use_mmap != 0, *st));
        DLLM__TRY(dllm__add_file_tensors(*m, std::move(st)));
    } else {
        return dllm__fail(DLLM_ERR_IO, "%s: neither model.safetensors nor model.safetensors.index.json exists", dir);
    }
    DLLM__TRY(dllm__soloq_load_store(*m));
    DLLM__TRY(dllm__bind_weights(*m));
    out = std::move(m);
    return DLLM_OK;
}
