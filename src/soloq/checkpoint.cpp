/* src/soloq/checkpoint.cpp - quantised checkpoints: written once by dllm_model_quantize, loaded. */

// ---- [quantised checkpoints]: SoloQ weights quantised once (dllm_model_quantize) and loaded ---------------------
//     The format (dllm.h's dllm_model_quantize, README.md): standard safetensors, per layer and site the packed codes
//     (U8 [rows][cols / 2]), NVFP4's block scales (U8 [rows][ceil(cols / 16)], NVFP4 only) and the row scales (F32
//     [rows]) exactly as dllm__q4_rows holds them, every tensor that stays unquantised copied from the source, and
//     __metadata__ keys dllm.* naming how they were made. A loaded file is checked against the config and its own
//     metadata; the rotations are not stored (a pure function of kind, d, seed and site).

static const char *const dllm__quant_version = "1";
static const char *const dllm__soloq_site_names[DLLM__SOLOQ_SITES] = {"qkv", "o", "gate_up", "down", "lm_head"};
static const char *const dllm__soloq_parts[3] = {"codes", "block_scales", "row_scale"};

/* "model.layers.{l}.soloq.{site}.", a routed expert's "model.layers.{l}.soloq.experts.{e}.{site}." or, for the head
 * (layer < 0), "lm_head.soloq.". */
static std::string dllm__soloq_prefix(int layer, int site, int expert = -1) {
    if (layer < 0) return "lm_head.soloq.";
    if (expert >= 0)
        return dllm__format("model.layers.%d.soloq.experts.%d.%s.", layer, expert, dllm__soloq_site_names[site]);
    return dllm__format("model.layers.%d.soloq.%s.", layer, dllm__soloq_site_names[site]);
}

static bool dllm__soloq_tensor_name(const std::string &name) { return name.find(".soloq.") != std::string::npos; }

/* The site a source tensor's linear is stored at (its first tensor: Q or the fused Q|K|V, gate, down, O, the head when
 * quantised), or -1: another stored linear's later rows (dllm__soloq_stacked) or copied as it is. */
static int dllm__soloq_site_of(dllm__wkind kind, bool quantize_head) {
    switch (kind) {
        case DLLM__W_Q:
        case DLLM__W_QKV: return DLLM__SOLOQ_QKV;
        case DLLM__W_O: return DLLM__SOLOQ_O;
        case DLLM__W_GATE:
        case DLLM__W_SHARED_GATE:
        case DLLM__W_EXPERT_GATE: return DLLM__SOLOQ_GU;
        case DLLM__W_DOWN:
        case DLLM__W_SHARED_DOWN:
        case DLLM__W_EXPERT_DOWN: return DLLM__SOLOQ_DOWN;
        case DLLM__W_HEAD: return quantize_head ? DLLM__SOLOQ_HEAD : -1;
        default: return -1;
    }
}

/* K and V (below Q), and every up (below its gate): rows of a linear stored at another tensor's site. */
static bool dllm__soloq_stacked(dllm__wkind kind) {
    return kind == DLLM__W_K || kind == DLLM__W_V || kind == DLLM__W_UP || kind == DLLM__W_SHARED_UP ||
           kind == DLLM__W_EXPERT_UP;
}

static bool dllm__soloq_replaces(const dllm_model &m, dllm__wkind kind) {
    return m.soloq && (dllm__soloq_stacked(kind) || dllm__soloq_site_of(kind, m.soloq->head != nullptr) >= 0);
}

/* The dllm.* metadata of options o made for `precision` (the rotation seed in hex: a JSON number loses bits). */
static std::vector<std::pair<std::string, std::string>> dllm__soloq_metadata(const dllm__soloq_options &o,
                                                                             int precision, const std::string &config) {
    return {{"dllm.quant_version", dllm__quant_version},
            {"dllm.precision", dllm__precision_name(precision)},
            {"dllm.weight_format", dllm__q4_names[o.weights]},
            {"dllm.rotation", dllm__rot_names[o.rotation]},
            {"dllm.rotation_seed", dllm__format("0x%016llx", (unsigned long long)o.seed)},
            {"dllm.bias_correction", o.bias_correction ? "1" : "0"},
            {"dllm.quantize_lm_head", o.quantize_head ? "1" : "0"},
            {"dllm.source_config", config}};
}

/* The dllm.* entries of one file's metadata, in order. */
static std::vector<std::pair<std::string, std::string>> dllm__dllm_metadata(const dllm__safetensors &st) {
    std::vector<std::pair<std::string, std::string>> out;
    for (const auto &kv : st.metadata)
        if (kv.first.compare(0, 5, "dllm.") == 0) out.push_back(kv);
    return out;
}

static dllm_status dllm__meta_get(const std::vector<std::pair<std::string, std::string>> &meta, const char *file,
                                  const char *key, std::string &value) {
    int n = 0;
    for (const auto &kv : meta)
        if (kv.first == key) value = kv.second, n++;
    if (n == 0) return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: __metadata__ has no \"%s\"", file, key);
    if (n > 1)
        return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: __metadata__ names \"%s\" %d times", file, key,
                          n);
    return DLLM_OK;
}

static dllm_status dllm__meta_flag(const std::vector<std::pair<std::string, std::string>> &meta, const char *file,
                                   const char *key, bool &flag) {
    std::string v;
    DLLM__TRY(dllm__meta_get(meta, file, key, v));
    if (v != "0" && v != "1")
        return dllm__fail(DLLM_ERR_FORMAT, "%s: quantised checkpoint: %s is \"%s\", expected \"0\" or \"1\"", file, key,
                          v.c_str());
    flag = v == "1";
    return DLLM_OK;
}

/* The options and precision a file's dllm.* metadata records, each value checked against the others and against the
 * model's config (dllm.source_config must describe the same shapes as config.json). */
static dllm_status dllm__soloq_parse_metadata(const std::vector<std::pair<std::string, std::string>> &meta,
                                              const char *file, const dllm__config &cfg, dllm__soloq_store &s) {
    std::string v;
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.quant_version", v));
    if (v != dllm__quant_version)
        return dllm__fail(
            DLLM_ERR_UNSUPPORTED,
            "%s: quantised checkpoint format version \"%s\"; this dllm reads version %s (quantise the model again)",
            file, v.c_str(), dllm__quant_version);
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.precision", v));
    s.precision = -1;
    for (int p = DLLM_PRECISION_SOLOQ_N; p <= DLLM_PRECISION_RTN_W4A16; p++)
        if (v == dllm__precision_name(p)) s.precision = p;
    if (s.precision < 0)
        return dllm__fail(
            DLLM_ERR_FORMAT,
            "%s: quantised checkpoint: dllm.precision \"%s\" is not a SoloQ precision (soloq-n, soloq-i, soloq-c, "
            "rtn-w4a4 or a -w4a16 form)",
            file, v.c_str());
    bool head = false;
    DLLM__TRY(dllm__meta_flag(meta, file, "dllm.quantize_lm_head", head));
    dllm__soloq_options o;  // the precision's formats; the rotation and the correction as recorded (below)
    DLLM__TRY(dllm__soloq_options_for(s.precision, head, DLLM_SOLOQ_ROTATION_DEFAULT, -1, o));
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.weight_format", v));
    if (v != dllm__q4_names[o.weights])
        return dllm__fail(
            DLLM_ERR_FORMAT,
            "%s: quantised checkpoint: dllm.weight_format \"%s\" does not match dllm.precision %s (whose weights are "
            "%s)",
            file, v.c_str(), dllm__precision_name(s.precision), dllm__q4_names[o.weights]);
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.rotation", v));
    int rot = -1;
    for (int i = 0; i < 6; i++)
        if (v == dllm__rot_names[i]) rot = i;
    if (rot < 0)
        return dllm__fail(
            DLLM_ERR_FORMAT,
            "%s: quantised checkpoint: dllm.rotation \"%s\" is not none, hadamard, rpbh, mixer, krpbh or haar", file,
            v.c_str());
    o.rotation = (dllm__rot_kind)rot;
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.rotation_seed", v));
    char *end = nullptr;
    errno = 0;
    const unsigned long long seed = strtoull(v.c_str(), &end, 16);
    if (v.size() != 18 || v.compare(0, 2, "0x") || errno || *end)
        return dllm__fail(DLLM_ERR_FORMAT,
                          "%s: quantised checkpoint: dllm.rotation_seed \"%s\" is not 0x and 16 hex digits", file,
                          v.c_str());
    o.seed = (uint64_t)seed;
    DLLM__TRY(dllm__meta_flag(meta, file, "dllm.bias_correction", o.bias_correction));
    if (o.weights == DLLM__Q4_RTN && (o.rotation != DLLM__ROT_NONE || o.bias_correction))
        return dllm__fail(
            DLLM_ERR_FORMAT,
            "%s: quantised checkpoint: %s has no rotation and no bias correction, the metadata says %s and %d", file,
            dllm__precision_name(s.precision), dllm__rot_names[o.rotation], (int)o.bias_correction);
    DLLM__TRY(dllm__meta_get(meta, file, "dllm.source_config", v));
    dllm__json root;
    dllm__config src;
    const std::string what = std::string(file) + " (dllm.source_config)";
    DLLM__TRY(dllm__json_parse(v.data(), v.size(), what, root));
    DLLM__TRY(dllm__config_parse(root, what, src));
    if (src.family != cfg.family || src.n_layer != cfg.n_layer || src.n_embd != cfg.n_embd ||
        src.n_head != cfg.n_head || src.n_head_kv != cfg.n_head_kv || src.head_dim != cfg.head_dim ||
        src.n_ff != cfg.n_ff || src.n_vocab != cfg.n_vocab || src.tied_embeddings != cfg.tied_embeddings ||
        src.n_expert != cfg.n_expert || src.n_ff_expert != cfg.n_ff_expert || src.n_ff_shared != cfg.n_ff_shared ||
        src.n_dense_layers != cfg.n_dense_layers)
        return dllm__fail(
            DLLM_ERR_SHAPE,
            "%s: quantised checkpoint: the model it was quantised from (%s, %d layers, d=%d, ff %d, vocab %d) is not "
            "the one "
            "config.json describes (%s, %d layers, d=%d, ff %d, vocab %d)",
            file, dllm__family_name(src.family), src.n_layer, src.n_embd, src.n_ff, src.n_vocab,
            dllm__family_name(cfg.family), cfg.n_layer, cfg.n_embd, cfg.n_ff, cfg.n_vocab);
    s.opt = o;
    return DLLM_OK;
}

/* One stored part of a site: present, of dtype and shape, or a clear error. */
static dllm_status dllm__soloq_part(const dllm_model &m, const std::string &name, dllm__dtype dtype,
                                    std::vector<int64_t> shape, const dllm__tensor *&t) {
    auto it = m.by_name.find(name);
    if (it == m.by_name.end())
        return dllm__fail(DLLM_ERR_SHAPE, "quantised checkpoint %s: missing tensor %s (%s %s)", m.dir.c_str(),
                          name.c_str(), dllm__dtypes[dtype].name, dllm__shape_str(shape).c_str());
    t = it->second;
    if (t->dtype != dtype || t->shape != shape)
        return dllm__fail(DLLM_ERR_SHAPE, "%s: tensor %s is %s %s, expected %s %s (the config's shapes)",
                          t->file->c_str(), name.c_str(), dllm__dtypes[t->dtype].name,
                          dllm__shape_str(t->shape).c_str(), dllm__dtypes[dtype].name, dllm__shape_str(shape).c_str());
    return DLLM_OK;
}

/* A site's rows read from the file (of routed expert `expert`, or the layer's own: -1): codes, NVFP4's block scales
 * (UE4M3: no sign, not NaN), finite row scales; rot: the layer's rotations. */
static dllm_status dllm__soloq_read_site(const dllm_model &m, const dllm__soloq_options &o, int layer, int site,
                                         int expert, dllm__soloq_rotations &rot, dllm__soloq_linear &lin) {
    const std::string prefix = dllm__soloq_prefix(layer, site, expert);
    dllm__q4_rows &q = lin.w;
    q.format = o.weights;
    dllm__soloq_site_shape(m.cfg, layer, site, expert, q.rows, q.cols);
    const dllm__tensor *codes = nullptr, *bs = nullptr, *scale = nullptr;
    DLLM__TRY(dllm__soloq_part(m, prefix + "codes", DLLM__U8, {q.rows, (int64_t)q.row_bytes()}, codes));
    DLLM__TRY(dllm__soloq_part(m, prefix + "row_scale", DLLM__F32, {q.rows}, scale));
    if (o.weights == DLLM__Q4_NVFP4)
        DLLM__TRY(dllm__soloq_part(m, prefix + "block_scales", DLLM__U8, {q.rows, q.blocks()}, bs));
    else if (m.by_name.count(prefix + "block_scales"))
        return dllm__fail(
            DLLM_ERR_FORMAT,
            "%s: tensor %sblock_scales: %s weights have no block scales (only NVFP4 has; the metadata says %s)",
            m.by_name.at(prefix + "block_scales")->file->c_str(), prefix.c_str(), dllm__q4_names[o.weights],
            dllm__q4_names[o.weights]);
    q.codes.assign(codes->data, codes->data + codes->nbytes);
    if (bs) {
        q.block_scales.assign(bs->data, bs->data + bs->nbytes);
        for (size_t i = 0; i < q.block_scales.size(); i++)
            if (q.block_scales[i] >= 0x7F)
                return dllm__fail(
                    DLLM_ERR_FORMAT,
                    "%s: tensor %sblock_scales holds 0x%02x at %zu: not a UE4M3 scale (sign or NaN); the file is "
                    "damaged",
                    bs->file->c_str(), prefix.c_str(), q.block_scales[i], i);
    }
    q.row_scale.resize((size_t)q.rows);
    memcpy(q.row_scale.data(), scale->data, scale->nbytes);
    for (int r = 0; r < q.rows; r++)
        if (!std::isfinite(q.row_scale[(size_t)r]))
            return dllm__fail(DLLM_ERR_FORMAT,
                              "%s: tensor %srow_scale holds %g at row %d: the checkpoint is damaged (non-finite scale)",
                              scale->file->c_str(), prefix.c_str(), q.row_scale[(size_t)r], r);
    lin.rot = rot.of(site, q.cols);
    return DLLM_OK;
}

/* [quantised checkpoints] Called by dllm__load_model before the BF16 tensors are bound: when the files' metadata says
 * dllm_model_quantize wrote them, reads every stored linear into m.soloq (the tensors they replace are then not
 * expected). Every file of a sharded checkpoint carries the same dllm.* metadata. */
static dllm_status dllm__soloq_load_store(dllm_model &m) {
    const dllm__safetensors *first = nullptr;
    std::vector<std::pair<std::string, std::string>> meta;
    for (const std::unique_ptr<dllm__safetensors> &f : m.files) {
        std::vector<std::pair<std::string, std::string>> mine = dllm__dllm_metadata(*f);
        if (!first)
            first = f.get(), meta = mine;
        else if (mine != meta)
            return dllm__fail(
                DLLM_ERR_FORMAT,
                "%s and %s carry different dllm.* metadata: the shards of a quantised checkpoint must come from one "
                "dllm-quantize run",
                first->file->path.c_str(), f->file->path.c_str());
    }
    if (!first) return DLLM_OK;
    if (meta.empty()) {
        for (const auto &kv : m.by_name)
            if (dllm__soloq_tensor_name(kv.first))
                return dllm__fail(
                    DLLM_ERR_FORMAT,
                    "%s: tensor %s looks quantised but the file's __metadata__ has no dllm.* keys (a quantised "
                    "checkpoint "
                    "names how it was made; quantise it again with dllm-quantize)",
                    kv.second->file->c_str(), kv.first.c_str());
        return DLLM_OK;
    }
    const char *file = first->file->path.c_str();
    std::shared_ptr<dllm__soloq_store> s = std::make_shared<dllm__soloq_store>();
    DLLM__TRY(dllm__soloq_parse_metadata(meta, file, m.cfg, *s));
    DLLM__TRY(dllm__soloq_check_dims(m.cfg, s->opt));
    for (int l = 0; l < m.cfg.n_layer; l++) {
        std::shared_ptr<dllm__soloq_layer> q = dllm__soloq_layer_for(m.cfg, l, s->opt);
        dllm__soloq_rotations rot{s->opt, (size_t)l, {}};
        for (const std::pair<int, int> &site : dllm__soloq_layer_linears(m.cfg, l)) {
            dllm__soloq_linear &lin = q->linear(site.first, site.second);
            DLLM__TRY(dllm__soloq_read_site(m, s->opt, l, site.first, site.second, rot, lin));
            m.n_params += (int64_t)lin.w.rows * lin.w.cols;
        }
        s->layers.push_back(q);
    }
    if (s->opt.quantize_head) {
        std::shared_ptr<dllm__soloq_layer> h = std::make_shared<dllm__soloq_layer>();
        h->opt = s->opt;
        dllm__soloq_rotations rot{s->opt, (size_t)m.cfg.n_layer, {}};
        DLLM__TRY(dllm__soloq_read_site(m, s->opt, -1, DLLM__SOLOQ_HEAD, -1, rot, h->lin[DLLM__SOLOQ_HEAD]));
        if (!m.cfg.tied_embeddings) m.n_params += (int64_t)m.cfg.n_vocab * m.cfg.n_embd;
        s->head = h;
    }
    // A stored tensor the metadata does not account for (another layer, a head not recorded) means the file lies.
    std::unordered_set<std::string> known;
    for (const char *part : dllm__soloq_parts) {
        if (s->head) known.insert(dllm__soloq_prefix(-1, DLLM__SOLOQ_HEAD) + part);
        for (int l = 0; l < m.cfg.n_layer; l++)
            for (const std::pair<int, int> &site : dllm__soloq_layer_linears(m.cfg, l))
                known.insert(dllm__soloq_prefix(l, site.first, site.second) + part);
    }
    for (const auto &kv : m.by_name) {
        if (dllm__soloq_tensor_name(kv.first) && !known.count(kv.first))
            return dllm__fail(
                DLLM_ERR_FORMAT,
                "%s: tensor %s is not part of the quantised checkpoint its metadata describes (%d layers, LM head %s)",
                kv.second->file->c_str(), kv.first.c_str(), m.cfg.n_layer, s->head ? "quantised" : "BF16");
    }
    m.soloq = s;
    dllm__log(DLLM_LOG_INFO, "%s: quantised checkpoint, %s (%s weights, rotation %s), LM head %s", m.dir.c_str(),
              dllm__precision_name(s->precision), dllm__q4_names[s->opt.weights], dllm__rot_names[s->opt.rotation],
              s->head ? "quantised" : "BF16");
    return DLLM_OK;
}

/* A context's precision on model m: AUTO resolves to what a quantised checkpoint holds (else BF16); on a quantised
 * checkpoint only the recorded weight format's two precisions (W4A4 and -W4A16) are valid, with the recorded rotation
 * and bias correction (soloq_rotation or soloq_bias_correction asking for another is an error: the weights were made
 * without it). */
static dllm_status dllm__resolve_precision(const dllm_model &m, int asked, int rotation, int bias_correction,
                                           int &precision) {
    precision = asked;
    if (!m.soloq) {
        if (asked == DLLM_PRECISION_AUTO) precision = DLLM_PRECISION_BF16;
        return DLLM_OK;
    }
    const dllm__soloq_store &s = *m.soloq;
    if (asked == DLLM_PRECISION_AUTO) precision = s.precision;
    auto base = [](int p) { return p >= DLLM_PRECISION_SOLOQ_N_W4A16 ? p - 4 : p; };
    if (!dllm__precision_is_soloq(precision) || base(precision) != base(s.precision))
        return dllm__fail(
            DLLM_ERR_INVALID_ARGUMENT,
            "%s holds %s weights (quantised by dllm-quantize as %s): --precision %s cannot run them; use --precision "
            "%s or "
            "%s-w4a16 (or leave it out), or load the unquantised model",
            m.dir.c_str(), dllm__q4_names[s.opt.weights], dllm__precision_name(s.precision),
            dllm__precision_name(precision), dllm__precision_name(base(s.precision)),
            dllm__precision_name(base(s.precision)));
    if (s.opt.weights != DLLM__Q4_RTN && rotation != DLLM_SOLOQ_ROTATION_DEFAULT && rotation - 1 != s.opt.rotation)
        return dllm__fail(
            DLLM_ERR_INVALID_ARGUMENT,
            "soloq_rotation %s (--soloq-rotation), but %s was quantised with rotation %s: leave it out or "
            "quantise again",
            dllm__rot_names[rotation - 1], m.dir.c_str(), dllm__rot_names[s.opt.rotation]);
    if (s.opt.weights != DLLM__Q4_RTN && bias_correction >= 0 && (bias_correction == 1) != s.opt.bias_correction)
        return dllm__fail(
            DLLM_ERR_INVALID_ARGUMENT,
            "soloq_bias_correction %d (--soloq-bias-correction), but %s was quantised with bias correction "
            "%s: leave it out or quantise again",
            bias_correction, m.dir.c_str(), s.opt.bias_correction ? "on" : "off");
    return DLLM_OK;
}

/* One tensor of a quantised checkpoint being written: copied from the source (src) or one part of a site's rows. */
struct dllm__qtensor {
    std::string name;
    dllm__dtype dtype = DLLM__U8;
    std::vector<int64_t> shape;
    size_t nbytes = 0;
    const dllm__tensor *src = nullptr;
    int layer = 0, site = 0, part = 0;  // quantised: layer (-1: the head), site, part (index in dllm__soloq_parts)
    int expert = -1;                    // quantised: the routed expert, or -1 (the layer's own linear)
};

static void dllm__qplan_site(std::vector<dllm__qtensor> &plan, const dllm__config &c, const dllm__soloq_options &o,
                             int layer, int site, int expert) {
    int rows = 0, cols = 0;
    dllm__soloq_site_shape(c, layer, site, expert, rows, cols);
    for (int part = 0; part < 3; part++) {
        if (part == 1 && o.weights != DLLM__Q4_NVFP4) continue;  // only NVFP4 has block scales
        dllm__qtensor t;
        t.name = dllm__soloq_prefix(layer, site, expert) + dllm__soloq_parts[part];
        t.dtype = part == 2 ? DLLM__F32 : DLLM__U8;
        t.shape = part == 0   ? std::vector<int64_t>{rows, cols / 2}
                  : part == 1 ? std::vector<int64_t>{rows, (cols + 15) / 16}
                              : std::vector<int64_t>{rows};
        t.nbytes = (size_t)rows * (part == 0 ? (size_t)cols / 2 : part == 1 ? (size_t)(cols + 15) / 16 : 4);
        t.layer = layer, t.site = site, t.part = part, t.expert = expert;
        plan.push_back(t);
    }
}

/* The tensors of the checkpoint in file order: the source's, with each layer's linears replaced by their sites (a
 * layer's parts are contiguous, so it is quantised once, when the writer reaches it). */
static std::vector<dllm__qtensor> dllm__qplan(const dllm_model &m, const dllm__soloq_options &o) {
    std::vector<dllm__qtensor> plan;
    for (const dllm__wspec &spec : dllm__expected_weights(m.cfg)) {
        const int site = dllm__soloq_site_of(spec.kind, o.quantize_head);
        if (site >= 0) dllm__qplan_site(plan, m.cfg, o, site == DLLM__SOLOQ_HEAD ? -1 : spec.layer, site, spec.expert);
        if (site >= 0 || dllm__soloq_stacked(spec.kind)) continue;
        dllm__qtensor t;
        t.src = dllm__find_weight(m, spec, t.name);
        t.dtype = t.src->dtype, t.shape = t.src->shape, t.nbytes = t.src->nbytes;
        plan.push_back(t);
    }
    if (m.cfg.tied_embeddings && o.quantize_head) dllm__qplan_site(plan, m.cfg, o, -1, DLLM__SOLOQ_HEAD, -1);
    return plan;
}

static std::string dllm__json_quote(const std::string &s) {
    std::string out = "\"";
    for (unsigned char ch : s) {
        if (ch == '"' || ch == '\\')
            out += '\\', out += (char)ch;
        else if (ch < 0x20)
            out += dllm__format("\\u%04x", ch);
        else
            out += (char)ch;
    }
    return out + "\"";
}

/* A safetensors header: __metadata__, then each tensor with offsets in order, padded with spaces to 8 bytes (as the
 * reference writer does, so the data buffer starts aligned). */
static std::string dllm__st_header(const std::vector<const dllm__qtensor *> &ts,
                                   const std::vector<std::pair<std::string, std::string>> &meta) {
    std::string h = "{\"__metadata__\":{";
    for (size_t i = 0; i < meta.size(); i++)
        h += (i ? "," : "") + dllm__json_quote(meta[i].first) + ":" + dllm__json_quote(meta[i].second);
    h += "}";
    size_t at = 0;
    for (const dllm__qtensor *t : ts) {
        h += "," + dllm__json_quote(t->name) + ":{\"dtype\":\"" + dllm__dtypes[t->dtype].name + "\",\"shape\":[";
        for (size_t i = 0; i < t->shape.size(); i++) h += (i ? "," : "") + std::to_string(t->shape[i]);
        h += dllm__format("],\"data_offsets\":[%zu,%zu]}", at, at + t->nbytes);
        at += t->nbytes;
    }
    h += "}";
    while (h.size() % 8) h += ' ';
    return h;
}

/* The source of the quantised parts: one layer at a time, quantised when the writer first needs it. */
struct dllm__qsource {
    const dllm_model &m;
    dllm__pool &pool;
    const dllm__soloq_options &o;
    const dllm_quantize_params &params;
    int layer = -2, done = 0;
    std::shared_ptr<const dllm__soloq_layer> q;

    const dllm__q4_rows &rows(int l, int site, int expert) {
        if (l != layer) {
            q = l < 0 ? dllm__soloq_quantize_head(m, pool, o) : dllm__soloq_quantize_layer(m, pool, o, (size_t)l);
            layer = l;
            if (params.progress)
                params.progress(++done, m.cfg.n_layer + (o.quantize_head ? 1 : 0), params.progress_user_data);
        }
        return q->linear(site, expert).w;
    }
};

static dllm_status dllm__write_all(FILE *f, const void *p, size_t n, const std::string &path) {
    if (n && fwrite(p, 1, n, f) != n) return dllm__fail(DLLM_ERR_IO, "writing %s: %s", path.c_str(), strerror(errno));
    return DLLM_OK;
}

/* Writes one file of the checkpoint (to a temporary name, renamed when complete). */
static dllm_status dllm__write_shard(const std::string &path, const std::vector<const dllm__qtensor *> &ts,
                                     const std::vector<std::pair<std::string, std::string>> &meta, dllm__qsource &src) {
    const std::string tmp = path + ".tmp", header = dllm__st_header(ts, meta);
    std::unique_ptr<FILE, int (*)(FILE *)> file(fopen(tmp.c_str(), "wb"), fclose);  // closed if quantising throws
    if (!file) return dllm__fail(DLLM_ERR_IO, "cannot create %s: %s", tmp.c_str(), strerror(errno));
    FILE *f = file.get();
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)header.size() >> (8 * i));
    dllm_status s = dllm__write_all(f, len, 8, tmp);
    if (s == DLLM_OK) s = dllm__write_all(f, header.data(), header.size(), tmp);
    for (size_t i = 0; i < ts.size() && s == DLLM_OK; i++) {
        const dllm__qtensor &t = *ts[i];
        const void *data = t.src ? (const void *)t.src->data : nullptr;
        if (!t.src) {
            const dllm__q4_rows &q = src.rows(t.layer, t.site, t.expert);
            data = t.part == 0   ? (const void *)q.codes.data()
                   : t.part == 1 ? (const void *)q.block_scales.data()
                                 : (const void *)q.row_scale.data();
        }
        s = dllm__write_all(f, data, t.nbytes, tmp);
    }
    if (fclose(file.release()) != 0 && s == DLLM_OK)
        s = dllm__fail(DLLM_ERR_IO, "writing %s: %s", tmp.c_str(), strerror(errno));
    if (s == DLLM_OK && rename(tmp.c_str(), path.c_str()) != 0)
        s = dllm__fail(DLLM_ERR_IO, "renaming %s to %s: %s", tmp.c_str(), path.c_str(), strerror(errno));
    if (s != DLLM_OK) unlink(tmp.c_str());
    return s;
}

static dllm_status dllm__write_text(const std::string &path, const std::string &text) {
    FILE *f = fopen(path.c_str(), "wb");
    if (!f) return dllm__fail(DLLM_ERR_IO, "cannot create %s: %s", path.c_str(), strerror(errno));
    dllm_status s = dllm__write_all(f, text.data(), text.size(), path);
    if (fclose(f) != 0 && s == DLLM_OK) s = dllm__fail(DLLM_ERR_IO, "writing %s: %s", path.c_str(), strerror(errno));
    return s;
}

/* A safetensors file name dllm_model_quantize writes (and, with overwrite, replaces). */
static bool dllm__is_checkpoint_file(const std::string &n) {
    const size_t len = n.size();
    return n == "model.safetensors" || n == "model.safetensors.index.json" ||
           (n.compare(0, 6, "model-") == 0 && len > 12 && n.compare(len - 12, 12, ".safetensors") == 0 &&
            n.find("-of-") != std::string::npos);
}

/* out exists as an empty directory (created, parents too), or holds files and overwrite is set (dllm's checkpoint
 * files in it are removed first, so no stale shard or index survives); never the source directory itself. */
static dllm_status dllm__prepare_out_dir(const std::string &out, const std::string &source, bool overwrite) {
    for (size_t i = 1; i <= out.size(); i++)
        if (i == out.size() || out[i] == '/') mkdir(out.substr(0, i).c_str(), 0755);
    struct stat st;
    if (stat(out.c_str(), &st) != 0)
        return dllm__fail(DLLM_ERR_IO, "cannot create the output directory %s: %s", out.c_str(), strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return dllm__fail(DLLM_ERR_IO, "%s exists and is not a directory: choose another output directory",
                          out.c_str());
    char *a = realpath(out.c_str(), nullptr), *b = realpath(source.c_str(), nullptr);
    const bool same = a && b && !strcmp(a, b);
    free(a);
    free(b);
    if (same)
        return dllm__fail(DLLM_ERR_INVALID_ARGUMENT,
                          "the output directory %s is the source model's directory: choose another one", out.c_str());
    DIR *d = opendir(out.c_str());
    if (!d) return dllm__fail(DLLM_ERR_IO, "cannot read the output directory %s: %s", out.c_str(), strerror(errno));
    std::vector<std::string> names;
    while (struct dirent *e = readdir(d))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) names.push_back(e->d_name);
    closedir(d);
    if (!names.empty() && !overwrite)
        return dllm__fail(
            DLLM_ERR_INVALID_ARGUMENT,
            "the output directory %s exists and is not empty (%s, ...): choose another one, or overwrite it "
            "(dllm-quantize --force)",
            out.c_str(), names[0].c_str());
    for (const std::string &n : names)
        if (dllm__is_checkpoint_file(n) && unlink(dllm__join_path(out, n.c_str()).c_str()) != 0)
            return dllm__fail(DLLM_ERR_IO, "cannot remove %s/%s: %s", out.c_str(), n.c_str(), strerror(errno));
    return DLLM_OK;
}

/* The files a model directory holds besides its weights, copied as they are. */
static const char *const dllm__model_side_files[] = {"config.json",
                                                     "generation_config.json",
                                                     "tokenizer.json",
                                                     "tokenizer_config.json",
                                                     "special_tokens_map.json",
                                                     "added_tokens.json",
                                                     "vocab.json",
                                                     "merges.txt",
                                                     "chat_template.jinja",
                                                     "chat_template.json"};

/* dllm_model_quantize: the checkpoint of model under options o (made for `precision`) into out. */
static dllm_status dllm__soloq_write(const dllm_model &m, const std::string &out, int precision,
                                     const dllm__soloq_options &o, const dllm_quantize_params &p) {
    std::string config;
    DLLM__TRY(dllm__read_text(dllm__join_path(m.dir, "config.json"), config));
    DLLM__TRY(dllm__prepare_out_dir(out, m.dir, p.overwrite != 0));
    const std::vector<std::pair<std::string, std::string>> meta = dllm__soloq_metadata(o, precision, config);
    const std::vector<dllm__qtensor> plan = dllm__qplan(m, o);
    std::vector<std::vector<const dllm__qtensor *>> shards(1);
    size_t bytes = 0, total = 0;
    for (const dllm__qtensor &t : plan) {
        if (!shards.back().empty() && bytes + t.nbytes > p.max_shard_bytes) shards.emplace_back(), bytes = 0;
        shards.back().push_back(&t);
        bytes += t.nbytes, total += t.nbytes;
    }
    dllm__pool pool(p.n_threads ? p.n_threads : (int)std::max(1u, std::thread::hardware_concurrency()));
    dllm__qsource src{m, pool, o, p, -2, 0, nullptr};
    std::string weight_map;
    for (size_t i = 0; i < shards.size(); i++) {
        const std::string name = shards.size() == 1
                                     ? std::string("model.safetensors")
                                     : dllm__format("model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
        DLLM__TRY(dllm__write_shard(dllm__join_path(out, name.c_str()), shards[i], meta, src));
        for (const dllm__qtensor *t : shards[i])
            weight_map +=
                (weight_map.empty() ? "" : ",\n    ") + dllm__json_quote(t->name) + ": " + dllm__json_quote(name);
    }
    if (shards.size() > 1)
        DLLM__TRY(dllm__write_text(
            dllm__join_path(out, "model.safetensors.index.json"),
            dllm__format("{\n  \"metadata\": {\"total_size\": %zu},\n  \"weight_map\": {\n    %s\n  }\n}\n", total,
                         weight_map.c_str())));
    for (const char *name : dllm__model_side_files) {
        const std::string from = dllm__join_path(m.dir, name);
        if (!dllm__file_exists(from)) continue;
        std::string text;
        DLLM__TRY(dllm__read_text(from, text));
        DLLM__TRY(dllm__write_text(dllm__join_path(out, name), text));
    }
    dllm__log(DLLM_LOG_INFO, "%s: %s checkpoint of %s, %zu tensors in %zu file(s), %.1f MB", out.c_str(),
              dllm__precision_name(precision), m.dir.c_str(), plan.size(), shards.size(), total / 1e6);
    return DLLM_OK;
}
