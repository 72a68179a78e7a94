/* src/decode/stepper.cpp - continuous batching (dllm_stepper): sequences join and leave a running batch between steps;
 * dllm_generate_batch is its loop. */

// ---- Continuous batching ----------------------------------------------------------------------------------------
// A stepper holds sequences in the order they were added. Each step: the sequences added since the last one join (their
// K/V cache slots taken, their generations started), every live sequence runs its next forward in ONE batched forward
// (dllm__batch_step, or dllm__bd_batch_round on a block-diffusion model), and those that end leave and free their
// slots; then the first sequence of a kind that has no batched forward (dllm_stepper::alone_reason) decodes whole,
// through dllm_generate's path. A sequence never sees the others: it gets the bits it gets in any batch, a batch of one
// included.
//
// K/V cache slots (sequences with a kv_cache; every block-diffusion sequence) outlive their sequences: a joining
// sequence takes the smallest free slot that holds its rows, else enlarges a free one, else adds one. So the slots of a
// long run stop growing at what its largest concurrent sequences need; a live slot is never resized
// (the backend may move it).

/* A K/V cache slot of a stepper: its rows and the sequence using it (-1: free). */
struct dllm__kv_slot {
    int rows = 0;
    int owner = -1;
};

}  // namespace
struct dllm_stepper {
    dllm_ctx &ctx;
    int max_sequences = 0;
    int max_fill_rows = 0;             // dllm_stepper_params' (0: no bound; dllm_generate_batch's)
    int fills_deferred = 0;            // sequences a step left waiting for their fill (tests)
    const char *who = "dllm_stepper";  // names the stepper in messages
    bool log_alone = true;             // log each sequence that decodes alone (dllm_generate_batch logs a summary)
    std::vector<std::unique_ptr<dllm__stepper_seq>> seqs;  // in the order they were added
    std::vector<dllm__kv_slot> slots;
    int next_id = 0;
    std::string no_batch, kv_why;  // why no sequence, or none with a K/V cache, joins a batched forward ("": they do)
    dllm_gen_stats counts = {};    // steps and forwards as dllm_generate_batch reports them
    std::vector<float> logits;
    std::vector<dllm__choice> choices;

    dllm_stepper(dllm_ctx &c, int max, const char *name);
    ~dllm_stepper();
    // block diffusion's rounds and slots (decode/batch_bd.cpp); LLaDA2 steps through them too
    bool block_diffusion() const {
        return dllm__is_block_diffusion(ctx.model->cfg) || ctx.model->cfg.family == DLLM_FAMILY_LLADA2;
    }
    const char *alone_reason(const dllm_gen_params &p) const;
    dllm_status room() const;
    int n_active() const;
    dllm__stepper_seq *find(int id) const;
    dllm_status add(const dllm_batch_item &item, dllm_batch_result *result, int *seq_id);
    dllm_status admit(dllm__stepper_seq &q);
    dllm_status step();
    void join(std::vector<dllm__stepper_seq *> &live);
    void defer_fills(std::vector<dllm__stepper_seq *> &live);
    int slots_needed(const dllm__stepper_seq &q, int &rows) const;
    void take_slots(std::vector<dllm__stepper_seq *> &joining);
    int take_slot(int rows, int owner, std::vector<bool> &fresh);
    dllm_status run_alone(dllm__stepper_seq &q);
    void retire(dllm__stepper_seq &q, dllm_status s);
    dllm_status cancel(dllm__stepper_seq &q);
    void remove(int id);
};
namespace {

/* Checks an item as dllm_generate would, for a kind decoded alone (no generation prepared). */
static dllm_status dllm__check_item(dllm_ctx &ctx, const dllm_batch_item &it) {
    const dllm__config &c = ctx.model->cfg;
    if (dllm__is_block_diffusion(c)) {
        dllm__bd_plan plan;
        return dllm__plan_block_diffusion(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, plan);
    }
    if (c.family == DLLM_FAMILY_LLADA2) {
        dllm__llada2_plan plan;
        return dllm__plan_llada2(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, plan);
    }
    dllm__gen_plan plan;
    return dllm__plan_generation(ctx, it.prompt, it.n_prompt, it.params, it.out, it.out_capacity, plan);
}

/* The step a sequence shows before its first: its canvas (prompt and masks where the schedule lays them out). */
static void dllm__watch_start(dllm__stepper_seq &q) {
    dllm_step_info info = {};
    std::vector<int32_t> canvas = q.g ? q.g->st.canvas : q.prompt;
    info.canvas = canvas.data(), info.canvas_len = (int)canvas.size(), info.prompt_len = q.item.n_prompt;
    info.n_blocks = q.g ? q.plan.n_blocks : q.bd ? q.bd_plan.n_blocks : q.l2 ? q.l2_plan.n_blocks : 0;
    info.n_masked = (int)canvas.size() - q.item.n_prompt;
    q.watch.record(info);
    q.watch.stepped = false;
}

}  // namespace

dllm_stepper::dllm_stepper(dllm_ctx &c, int max, const char *name) : ctx(c), max_sequences(max), who(name) {
    const dllm__batch_caps caps = ctx.impl->batch_caps();
    if (block_diffusion())
        no_batch = caps.block_diffusion;
    else if (!caps.plain.empty())
        no_batch = caps.plain;
    else if (!caps.kv.empty())
        kv_why = "a K/V cache: " + caps.kv;
    ctx.stepper = this;
}

dllm_stepper::~dllm_stepper() {
    ctx.stepper = nullptr;
    if (slots.empty()) return;
    std::string error;  // releasing cannot fail; a failure's message stays the thread's (swaps allocate nothing)
    error.swap(dllm__tls_error);
    if (block_diffusion())
        ctx.impl->bd_batch_reserve({}, {});
    else
        ctx.impl->batch_kv_reserve({}, {});
    dllm__tls_error.swap(error);
}

/* Why a sequence with these parameters decodes alone, whole inside one step, or null if it joins the batched
 * forwards. */
const char *dllm_stepper::alone_reason(const dllm_gen_params &p) const {
    if (!no_batch.empty()) return no_batch.c_str();
    if (p.tuned_forwards && !ctx.impl->solo_equals_batch())
        return "tuned_forwards (--tuned-forwards) asks for dllm_generate's own forwards";
    if (dllm__enum_int(p.kv_cache) != DLLM_KV_CACHE_NONE && !kv_why.empty()) return kv_why.c_str();
    return nullptr;
}

/* DLLM_OK if a sequence may be added, else DLLM_ERR_FULL. */
dllm_status dllm_stepper::room() const {
    if (n_active() < max_sequences) return DLLM_OK;
    return dllm__fail(DLLM_ERR_FULL, "%s: %d sequences decode already (max_sequences): step until one ends", who,
                      max_sequences);
}

int dllm_stepper::n_active() const {
    int n = 0;
    for (const auto &q : seqs) n += q->at != dllm__stepper_seq::ENDED;
    return n;
}

dllm__stepper_seq *dllm_stepper::find(int id) const {
    for (const auto &q : seqs)
        if (q->id == id) return q.get();
    return nullptr;
}

/* A new sequence (its outcome into result, or its own): checked as dllm_generate would check it; a bad one is not
 * added, its status and message in result (BUFFER_TOO_SMALL: n_out the capacity needed). */
dllm_status dllm_stepper::add(const dllm_batch_item &item, dllm_batch_result *result, int *seq_id) {
    if (seq_id) *seq_id = -1;
    DLLM__TRY(room());
    std::unique_ptr<dllm__stepper_seq> q(new dllm__stepper_seq);
    q->id = next_id, q->item = item, q->t0 = dllm__now_ms();
    q->prompt.assign(item.prompt, item.prompt + (item.prompt && item.n_prompt > 0 ? item.n_prompt : 0));
    if (item.prompt) q->item.prompt = q->prompt.data();
    q->result = result ? result : &q->own_result;
    dllm_status s = dllm__check_tuned_forwards(item.params);
    if (s == DLLM_OK) s = admit(*q);
    if (s != DLLM_OK) {
        if (s == DLLM_ERR_BUFFER_TOO_SMALL)
            q->result->n_out = dllm__out_needed(ctx, item.n_prompt, item.params);  // as dllm_generate reports it
        dllm__batch_set_status(*q->result, s);
        return s;
    }
    if (q->at == dllm__stepper_seq::ALONE && log_alone)
        dllm__log(DLLM_LOG_INFO, "%s: sequence %d decodes alone, outside the batched forwards (%s)", who, q->id,
                  alone_reason(item.params));
    dllm__watch_start(*q);
    if (seq_id) *seq_id = q->id;
    next_id++;
    seqs.push_back(std::move(q));
    return DLLM_OK;
}

/* Checks a sequence and prepares its generation, or marks it to decode alone. */
dllm_status dllm_stepper::admit(dllm__stepper_seq &q) {
    if (alone_reason(q.item.params)) {
        DLLM__TRY(dllm__check_item(ctx, q.item));
        q.at = dllm__stepper_seq::ALONE;
        return DLLM_OK;
    }
    return block_diffusion() ? dllm__bd_batch_admit(ctx, q) : dllm__batch_admit(ctx, q);
}

/* The slots a sequence needs (of `rows` rows each). */
int dllm_stepper::slots_needed(const dllm__stepper_seq &q, int &rows) const {
    if (!block_diffusion()) return dllm__batch_slots_needed(q, rows);
    rows = q.l2 ? q.l2->cache_rows() : q.bd->cache_rows();
    return 1;
}

/* A free slot of at least `rows` rows (the smallest), else a free one enlarged, else a new one, for owner; fresh[s]
 * marks the slots taken now. */
int dllm_stepper::take_slot(int rows, int owner, std::vector<bool> &fresh) {
    int best = -1, largest = -1;
    for (size_t s = 0; s < slots.size(); s++) {
        const dllm__kv_slot &k = slots[s];
        if (k.owner >= 0) continue;
        if (k.rows >= rows && (best < 0 || k.rows < slots[(size_t)best].rows)) best = (int)s;
        if (largest < 0 || k.rows > slots[(size_t)largest].rows) largest = (int)s;
    }
    if (best < 0) best = largest;  // enlarged below
    if (best < 0) best = (int)slots.size(), slots.push_back(dllm__kv_slot());
    slots[(size_t)best] = {std::max(rows, slots[(size_t)best].rows), owner};
    fresh.resize(slots.size());
    fresh[(size_t)best] = true;
    return best;
}

/* The joining sequences' slots, laid out by the backend with the live sequences' kept. If the backend cannot hold them
 * (memory), the joining sequences that need one decode alone instead. */
void dllm_stepper::take_slots(std::vector<dllm__stepper_seq *> &joining) {
    const std::vector<dllm__kv_slot> before = slots;
    std::vector<bool> fresh(slots.size());
    for (dllm__stepper_seq *q : joining) {
        int rows = 0;
        const int n = slots_needed(*q, rows);
        for (int c = 0; c < n; c++) q->slot[c] = take_slot(rows, q->id, fresh);
    }
    if (std::find(fresh.begin(), fresh.end(), true) == fresh.end()) return;
    std::vector<int> rows;
    std::vector<bool> keep;
    for (size_t s = 0; s < slots.size(); s++)
        rows.push_back(slots[s].rows), keep.push_back(slots[s].owner >= 0 && !fresh[s]);
    const dllm_status s =
        block_diffusion() ? ctx.impl->bd_batch_reserve(rows, keep) : ctx.impl->batch_kv_reserve(rows, keep);
    if (s == DLLM_OK) return;
    slots = before;
    int n_alone = 0;
    for (dllm__stepper_seq *q : joining)
        if (q->slot[0] >= 0) q->slot[0] = q->slot[1] = -1, q->at = dllm__stepper_seq::ALONE, n_alone++;
    dllm__log(DLLM_LOG_INFO,
              "%s: %d sequences decode one after another, outside the batched forwards (a K/V cache: %s)", who, n_alone,
              dllm__tls_error.c_str());
}

/* The sequences added since the last step join it: their slots, then their generations started (one that cannot start
 * ends at once). Those that may not join (their slots do not fit) wait to decode alone. */
void dllm_stepper::join(std::vector<dllm__stepper_seq *> &live) {
    std::vector<dllm__stepper_seq *> joining;
    for (const auto &q : seqs)
        if (q->at == dllm__stepper_seq::JOINING) joining.push_back(q.get());
    if (joining.empty()) return;
    take_slots(joining);
    for (dllm__stepper_seq *q : joining) {
        if (q->at != dllm__stepper_seq::JOINING) continue;
        q->at = dllm__stepper_seq::LIVE;
        const bool started = q->bd || q->l2 ? dllm__bd_batch_start(*q) : (q->status = q->g->start()) == DLLM_OK;
        if (started)
            live.push_back(q);
        else
            retire(*q, q->status);
    }
}

/* [dual cache] [prefix cache] Leaves out of this step the sequences due for a fill past max_fill_rows rows of fills:
 * those joining now go first (their fill is their prefill: what a new request waits for), then those that waited
 * longest, then the rest in order; one always goes. A sequence left out keeps its state and waits a step (its tokens
 * do not depend on when it steps). */
void dllm_stepper::defer_fills(std::vector<dllm__stepper_seq *> &live) {
    if (max_fill_rows <= 0 || block_diffusion()) return;
    std::vector<dllm__stepper_seq *> fills;
    for (dllm__stepper_seq *q : live)
        if (dllm__batch_fills(*q)) fills.push_back(q);
    if (fills.size() < 2) {
        for (dllm__stepper_seq *q : fills) q->fill_waits = 0;  // it goes
        return;
    }
    std::stable_sort(fills.begin(), fills.end(), [](const dllm__stepper_seq *a, const dllm__stepper_seq *b) {
        const bool ja = a->g->st.forwards == 0, jb = b->g->st.forwards == 0;  // joining now
        return ja != jb ? ja : a->fill_waits > b->fill_waits;
    });
    std::vector<const dllm__stepper_seq *> waiting;
    size_t rows = 0;
    for (dllm__stepper_seq *q : fills) {
        const size_t n = q->g->st.canvas.size() * (q->slot[1] >= 0 ? 2 : 1);  // CFG: two canvases
        if (rows > 0 && rows + n > (size_t)max_fill_rows)
            waiting.push_back(q);
        else
            rows += n;
    }
    std::vector<dllm__stepper_seq *> going;
    for (dllm__stepper_seq *q : live) {
        const bool waits = std::find(waiting.begin(), waiting.end(), q) != waiting.end();
        q->fill_waits = waits ? q->fill_waits + 1 : 0;
        if (!waits) going.push_back(q);
    }
    fills_deferred += (int)waiting.size();
    live.swap(going);
}

dllm_status dllm_stepper::step() {
    for (const auto &q : seqs) q->watch.stepped = false;
    std::vector<dllm__stepper_seq *> live, ended;
    for (const auto &q : seqs)
        if (q->at == dllm__stepper_seq::LIVE) live.push_back(q.get());
    join(live);
    defer_fills(live);
    if (!live.empty()) {
        const dllm_status s = block_diffusion() ? dllm__bd_batch_round(ctx, live, ended, logits, choices)
                                                : dllm__batch_step(ctx, live, ended, logits);
        if (s != DLLM_OK) {
            for (dllm__stepper_seq *q : live) retire(*q, s);
            return s;
        }
        counts.forwards++, counts.steps += !block_diffusion();
        for (dllm__stepper_seq *q : ended) retire(*q, q->status);
    }
    for (const auto &q : seqs)
        if (q->at == dllm__stepper_seq::ALONE) return run_alone(*q);
    return DLLM_OK;
}

/* A sequence decoded whole by dllm_generate's path: its one event is its end, the generated ids all committed at once.
 * Only running out of memory is the step's failure. */
dllm_status dllm_stepper::run_alone(dllm__stepper_seq &q) {
    const dllm_status s = dllm__batch_decode_alone(ctx, q.item, *q.result, counts);
    q.at = dllm__stepper_seq::ENDED;
    const int n_out = s == DLLM_OK || s == DLLM_ERR_CANCELLED ? q.result->n_out : 0;
    std::vector<int32_t> canvas = q.prompt, committed;
    for (int i = 0; i < n_out; i++) canvas.push_back(q.item.out[i]), committed.push_back(q.item.n_prompt + i);
    dllm_step_info info = q.watch.info;
    info.canvas = canvas.data(), info.canvas_len = (int)canvas.size();
    info.committed_pos = committed.data(), info.n_committed = n_out, info.n_masked = 0;
    info.global_step = info.total_steps = q.result->stats.steps;
    q.watch.record(info);
    return s == DLLM_ERR_OUT_OF_MEMORY ? s : DLLM_OK;
}

/* A sequence ends (s: how): its output, stats and status, and its slots free for the next one. */
void dllm_stepper::retire(dllm__stepper_seq &q, dllm_status s) {
    if (q.g)
        dllm__batch_retire(q, s);
    else
        dllm__bd_batch_retire(q, s);
    if (block_diffusion()) counts.steps = std::max(counts.steps, q.l2 ? q.l2->steps : q.bd->steps);
    for (dllm__kv_slot &k : slots)
        if (k.owner == q.id) k.owner = -1;
    q.at = dllm__stepper_seq::ENDED;
}

/* Ends a sequence that has not: with the canvas so far in its output where it started, with nothing where it did
 * not. */
dllm_status dllm_stepper::cancel(dllm__stepper_seq &q) {
    if (q.at == dllm__stepper_seq::ENDED) return DLLM_OK;
    const dllm_status s =
        dllm__fail(DLLM_ERR_CANCELLED, "%s: sequence %d cancelled after %d steps", who, q.id, q.watch.info.global_step);
    if (q.at == dllm__stepper_seq::LIVE) {
        retire(q, s);
        return DLLM_OK;
    }
    q.result->n_out = 0, q.result->stats.n_prompt = q.item.n_prompt;
    dllm__batch_set_status(*q.result, s);
    for (dllm__kv_slot &k : slots)
        if (k.owner == q.id) k.owner = -1;
    q.at = dllm__stepper_seq::ENDED;
    return DLLM_OK;
}

void dllm_stepper::remove(int id) {
    seqs.erase(std::remove_if(seqs.begin(), seqs.end(), [&](const auto &q) { return q->id == id; }), seqs.end());
}
namespace {

/* dllm_generate_batch: its items in one stepper, stepped until every one has ended. A bad item fails alone at its
 * admission; a global failure (a failing batched forward, an item decoded alone running out of memory) ends the call,
 * the items not finished then taking its status (dllm_generate_batch). stats: dllm_generate_batch's batch_stats. */
static dllm_status dllm__generate_batch_impl(dllm_ctx &ctx, const dllm_batch_item *items, int n_items,
                                             dllm_batch_result *results, dllm_gen_stats &stats) {
    dllm_stepper stepper(ctx, n_items, "dllm_generate_batch");
    stepper.log_alone = false;
    int n_alone = 0, first_alone = -1;
    for (int i = 0; i < n_items; i++) {
        if (!stepper.alone_reason(items[i].params)) continue;
        n_alone++;
        if (first_alone < 0) first_alone = i;
    }
    if (n_alone > 0) {
        const char *kind = ctx.model->cfg.family == DLLM_FAMILY_LLADA2 ? "LLaDA2 "
                           : stepper.block_diffusion()                   ? "block-diffusion "
                                                                         : "";
        dllm__log(
            DLLM_LOG_INFO,
            "dllm_generate_batch: %d %sitems decode one after another, outside a batched forward (%d items in all; "
            "item %d: %s)",
            n_alone, kind, n_items, first_alone, stepper.alone_reason(items[first_alone].params));
    }
    for (int i = 0; i < n_items; i++) stepper.add(items[i], &results[i], nullptr);
    dllm_status s = DLLM_OK;
    while (s == DLLM_OK && stepper.n_active() > 0) s = stepper.step();
    stats.steps = stepper.counts.steps, stats.forwards = stepper.counts.forwards;
    return s;
}

/* dllm_generate on a backend whose solo forwards give other bits than its batched ones (solo_equals_batch): the prompt
 * decodes as a batch of one, so that it gets the bits it gets in any batch. A kind that has no batched forward, or
 * whose K/V cache slot does not fit, decodes alone inside the stepper (dllm_stepper::run_alone), as in any batch. */
static bool dllm__generate_as_batch(const dllm_ctx &ctx, const dllm_gen_params &p) {
    return !ctx.impl->solo_equals_batch() && !ctx.stepper && !p.tuned_forwards;
}
static dllm_status dllm__generate_one(dllm_ctx &ctx, const int32_t *prompt, int n_prompt, const dllm_gen_params &p,
                                      int32_t *out, int out_capacity, int *n_out, dllm_gen_stats *stats) {
    dllm_stepper stepper(ctx, 1, "dllm_generate");
    stepper.log_alone = false;
    dllm_batch_result r;
    memset(&r, 0, sizeof r);
    dllm_status s = stepper.add({prompt, n_prompt, p, out, out_capacity}, &r, nullptr);
    while (s == DLLM_OK && stepper.n_active() > 0) s = stepper.step();
    if (s == DLLM_OK) s = r.status;
    if (n_out) *n_out = r.n_out;
    if (stats) *stats = r.stats;
    // The item's message was copied when it failed; later work may have replaced the thread's.
    if (s != DLLM_OK && dllm__tls_error.compare(0, strlen(r.error), r.error) != 0) dllm__tls_error = r.error;
    return s;
}
