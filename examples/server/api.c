/* api.c - OpenAI request fields and dllm's own (under dllm-generate's flag names, with its defaults). The checks
 * mirror dllm-generate's so that a request is refused with the field to change rather than a library message. */
#include "api.h"
#include "../common.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void api_error_set(api_error *e, int http_status, const char *type, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    e->http_status = http_status;
    e->type = type;
    e->param = param;
    e->code = code;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

char *api_error_json(const api_error *e) {
    cJSON *root = cJSON_CreateObject(), *obj = cJSON_AddObjectToObject(root, "error");
    char *text = NULL;
    if (obj && cJSON_AddStringToObject(obj, "message", e->message) && cJSON_AddStringToObject(obj, "type", e->type) &&
        (e->param ? cJSON_AddStringToObject(obj, "param", e->param) : cJSON_AddNullToObject(obj, "param")) &&
        (e->code ? cJSON_AddStringToObject(obj, "code", e->code) : cJSON_AddNullToObject(obj, "code")))
        text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    return text;
}

/* ---- typed field access: absent and null both mean "not given" (clients send either) ------------------------- */

/* A 400 invalid_request_error; returns -1 so that a check can end with "return bad_request(...)". */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static int bad_request(api_error *err, const char *param, const char *code, const char *fmt, ...) {
    va_list ap;
    err->http_status = 400;
    err->type = "invalid_request_error";
    err->param = param;
    err->code = code;
    va_start(ap, fmt);
    vsnprintf(err->message, sizeof err->message, fmt, ap);
    va_end(ap);
    return -1;
}

static int out_of_memory(api_error *err) {
    api_error_set(err, 500, "server_error", NULL, NULL, "out of memory");
    return -1;
}

static const cJSON *field(const cJSON *obj, const char *name) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(obj, name);
    return f && !cJSON_IsNull(f) ? f : NULL;
}

/* Each getter: 0 = absent, 1 = read into *out, -1 = wrong type or out of range (*err filled). */
static int get_int(const cJSON *obj, const char *name, double lo, double hi, int *out, api_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || f->valuedouble != floor(f->valuedouble))
        return bad_request(err, name, "invalid_type", "'%s' must be an integer", name);
    if (f->valuedouble < lo || f->valuedouble > hi)
        return bad_request(err, name, "invalid_value", "'%s' must be in [%.0f, %.0f], not %.17g", name, lo, hi, f->valuedouble);
    *out = (int)f->valuedouble;
    return 1;
}

static int get_double(const cJSON *obj, const char *name, double *out, api_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsNumber(f) || !isfinite(f->valuedouble)) return bad_request(err, name, "invalid_type", "'%s' must be a number", name);
    *out = f->valuedouble;
    return 1;
}

static int get_bool(const cJSON *obj, const char *name, int *out, api_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsBool(f)) return bad_request(err, name, "invalid_type", "'%s' must be true or false", name);
    *out = cJSON_IsTrue(f);
    return 1;
}

static int get_string(const cJSON *obj, const char *name, const char **out, api_error *err) {
    const cJSON *f = field(obj, name);
    if (!f) return 0;
    if (!cJSON_IsString(f)) return bad_request(err, name, "invalid_type", "'%s' must be a string", name);
    *out = f->valuestring;
    return 1;
}

/* Two spellings of one field (dllm's CLI name and an alias) given together: -1 after filling *err, else 0. */
static int both_given(const cJSON *obj, const char *a, const char *b, api_error *err) {
    return field(obj, a) && field(obj, b) ? bad_request(err, b, "invalid_value", "'%s' and '%s' are the same field: pass one", a, b) : 0;
}

static int pick_choice(const cJSON *obj, const char *name, const char *const *names, int n, int *out, api_error *err) {
    const char *s = NULL;
    int rc = get_string(obj, name, &s, err), i;
    if (rc <= 0) return rc;
    for (i = 0; i < n; i++)
        if (!strcmp(s, names[i])) { *out = i; return 1; }
    {
        char list[256] = "";
        for (i = 0; i < n; i++) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", i ? ", " : "", names[i]);
        return bad_request(err, name, "invalid_value", "'%s' must be one of %s, not \"%.64s\"", name, list, s);
    }
}

/* ---- sampling and schedule fields ---------------------------------------------------------------------------- */

typedef struct given_fields {
    int block, steps, early_stop, threshold, factor, timesteps, dpad_uniform, dpad_shape;
} given_fields;

static int parse_gen_fields(const server *srv, const cJSON *body, api_request *r, given_fields *given, api_error *err) {
    static const char *const caches[] = {"none", "prefix", "dual"}, *const lacaches[] = {"off", "truncate", "on"};
    static const struct { const char *name; dllm_remasking value; } algs[] = {
        {"low_confidence", DLLM_REMASK_LOW_CONFIDENCE}, {"maskgit_plus", DLLM_REMASK_LOW_CONFIDENCE}, {"topk_margin", DLLM_REMASK_MARGIN},
        {"entropy", DLLM_REMASK_ENTROPY}, {"origin", DLLM_REMASK_ORIGIN}, {"random", DLLM_REMASK_RANDOM}};
    dllm_gen_params *g = &r->gen;
    const char *alg_name = NULL, *alg_field = field(body, "remasking") ? "remasking" : "alg";
    double d = 0;
    int k = 0, rc, flag = 0;
    size_t i;

    if (both_given(body, "max_tokens", "max_completion_tokens", err) || both_given(body, "block_length", "block", err) ||
        both_given(body, "remasking", "alg", err) || both_given(body, "cfg", "cfg_scale", err) ||
        both_given(body, "sub_block_length", "sub_block", err))
        return -1;
    if ((rc = get_int(body, "max_tokens", 1, srv->cfg.max_tokens, &g->gen_length, err)) < 0 ||
        (!rc && get_int(body, "max_completion_tokens", 1, srv->cfg.max_tokens, &g->gen_length, err) < 0))
        return -1;
    if ((given->steps = get_int(body, "steps", 1, 1 << 24, &g->steps, err)) < 0) return -1;
    if ((rc = get_int(body, "block_length", 1, 1 << 20, &g->block_length, err)) < 0 ||
        (!rc && (rc = get_int(body, "block", 1, 1 << 20, &g->block_length, err)) < 0))
        return -1;
    given->block = rc;
    if (get_double(body, "temperature", &d, err) < 0) return -1;
    if (field(body, "temperature")) {
        if (!(d >= 0 && d <= 100)) return bad_request(err, "temperature", "invalid_value", "'temperature' must be in [0, 100] (0 = greedy)");
        g->temperature = (float)d;
    }
    if (get_int(body, "top_k", 0, 1 << 30, &g->top_k, err) < 0) return -1;
    if ((rc = get_double(body, "top_p", &d, err)) < 0) return -1;
    if (rc) {
        if (!(d > 0 && d <= 1)) return bad_request(err, "top_p", "invalid_value", "'top_p' must be in (0, 1] (1 = off)");
        g->top_p = (float)d;
    }
    if ((rc = get_double(body, "min_p", &d, err)) < 0) return -1;
    if (rc) {
        if (!(d >= 0 && d <= 1)) return bad_request(err, "min_p", "invalid_value", "'min_p' must be in [0, 1] (0 = off)");
        g->min_p = (float)d;
    }
    {
        const cJSON *seed = field(body, "seed");
        if (seed) {
            if (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble) || seed->valuedouble < -1 || seed->valuedouble > 9007199254740992.0)
                return bad_request(err, "seed", "invalid_type", "'seed' must be an integer >= 0 (or -1: a fresh one)");
            if (seed->valuedouble >= 0) g->seed = (uint64_t)seed->valuedouble;
            else r->seed_drawn = 1;
        } else {
            r->seed_drawn = 1;  /* decided below: drawn only where something is random */
        }
    }
    if ((rc = get_string(body, alg_field, &alg_name, err)) < 0) return -1;
    if (rc) {
        for (i = 0; i < sizeof algs / sizeof algs[0] && strcmp(alg_name, algs[i].name); i++) {}
        if (i == sizeof algs / sizeof algs[0])
            return bad_request(err, alg_field, "invalid_value", "'%s' must be low_confidence, maskgit_plus, topk_margin, entropy, origin or random", alg_field);
        g->remasking = algs[i].value;
    }
    if ((rc = pick_choice(body, "lacache", lacaches, 3, &k, err)) < 0) return -1;
    if (rc) g->lacache = (dllm_lacache)k;
    if ((rc = pick_choice(body, "cache", caches, 3, &k, err)) < 0) return -1;
    if (rc) g->kv_cache = (dllm_kv_cache)k;
    if ((rc = get_double(body, "cfg", &d, err)) < 0 || (!rc && (rc = get_double(body, "cfg_scale", &d, err)) < 0)) return -1;
    if (rc) {
        if (!(d >= 0)) return bad_request(err, "cfg", "invalid_value", "'cfg' must be >= 0 (0 = off)");
        g->cfg_scale = (float)d;
    }
    if ((given->threshold = get_double(body, "threshold", &g->threshold, err)) < 0) return -1;
    if (given->threshold) g->unmask = DLLM_UNMASK_THRESHOLD;
    if ((given->factor = get_double(body, "factor", &g->factor, err)) < 0) return -1;
    if (given->factor) {
        if (!(g->factor > 0)) return bad_request(err, "factor", "invalid_value", "'factor' must be > 0");
        g->unmask = DLLM_UNMASK_FACTOR;
    }
    if (given->threshold && given->factor) return bad_request(err, "factor", "invalid_value", "'threshold' and 'factor' conflict: pass one");
    if (get_bool(body, "timesteps", &flag, err) < 0) return -1;
    if (flag) {
        if (given->threshold || given->factor)
            return bad_request(err, "timesteps", "invalid_value", "'timesteps' and '%s' conflict: pass one", given->threshold ? "threshold" : "factor");
        g->unmask = DLLM_UNMASK_TIMESTEPS;
        given->timesteps = 1;
    }
    if ((rc = get_double(body, "eps", &d, err)) < 0) return -1;
    if (rc) {
        if (!(d > 0 && d < 1)) return bad_request(err, "eps", "invalid_value", "'eps' must be in (0, 1)");
        g->eps = d;
    }
    if ((rc = get_double(body, "alg_temp", &d, err)) < 0) return -1;
    if (rc) {
        if (!(d >= 0)) return bad_request(err, "alg_temp", "invalid_value", "'alg_temp' must be >= 0");
        g->alg_temp = d;
    }
    if ((given->early_stop = get_bool(body, "early_stop", &g->early_stop, err)) < 0) return -1;
    if (get_bool(body, "stop_at_eos", &g->stop_at_eos, err) < 0 || get_bool(body, "logits_eos_inf", &g->logits_eos_inf, err) < 0 ||
        get_bool(body, "eos_eot_last", &g->confidence_eos_eot_inf, err) < 0 || get_bool(body, "block_cache", &g->block_cache, err) < 0)
        return -1;
    if ((rc = get_int(body, "sub_block_length", 1, 1 << 20, &g->sub_block_length, err)) < 0 ||
        (!rc && get_int(body, "sub_block", 1, 1 << 20, &g->sub_block_length, err) < 0))
        return -1;
    if ((rc = get_int(body, "dpad_window", 2, 1 << 20, &g->dpad_window, err)) < 0) return -1;
    if (rc && g->dpad == DLLM_DPAD_OFF) g->dpad = DLLM_DPAD_GAUSSIAN;
    if ((rc = get_double(body, "dpad_k", &d, err)) < 0) return -1;
    if (rc) {
        if (!(d >= 0)) return bad_request(err, "dpad_k", "invalid_value", "'dpad_k' must be >= 0");
        g->dpad_k = (float)d;
        given->dpad_shape = 1;
    }
    if ((rc = get_double(body, "dpad_scale", &d, err)) < 0) return -1;
    if (rc) {
        if (!(d >= 0)) return bad_request(err, "dpad_scale", "invalid_value", "'dpad_scale' must be >= 0");
        g->dpad_scale = (float)d;
        given->dpad_shape = 1;
    }
    if ((given->dpad_uniform = get_int(body, "dpad_uniform", 0, 1 << 20, &g->dpad_n, err)) < 0) return -1;
    if (given->dpad_uniform) {
        if (given->dpad_shape) return bad_request(err, "dpad_uniform", "invalid_value", "'dpad_uniform' and 'dpad_k' / 'dpad_scale' conflict: pass one");
        g->dpad = DLLM_DPAD_UNIFORM;
    }
    return 0;
}

/* dllm-generate's defaults that follow other options, its block-diffusion defaults and its schedule checks. */
static int settle_schedule(const server *srv, api_request *r, const given_fields *given, api_error *err) {
    dllm_gen_params *g = &r->gen;
    const int block_diffusion = srv->info.block_size > 0;
    const int counted = g->unmask == DLLM_UNMASK_SCHEDULE || g->unmask == DLLM_UNMASK_TIMESTEPS;
    int b, n_blocks;
    if (!given->block) {
        if (block_diffusion) g->block_length = srv->info.block_size;
        else {
            for (b = g->gen_length < 32 ? g->gen_length : 32; g->gen_length % b; b--) {}
            g->block_length = b;
        }
    }
    if (!given->steps) g->steps = g->gen_length;
    if (!given->early_stop) g->early_stop = block_diffusion ? 0 : g->stop_at_eos;
    if (g->remasking == DLLM_REMASK_ORIGIN && g->unmask == DLLM_UNMASK_SCHEDULE) g->unmask = DLLM_UNMASK_TIMESTEPS;
    if (g->gen_length % g->block_length) {
        for (b = g->block_length; g->gen_length % b; b--) {}
        return bad_request(err, "block_length", "invalid_value", "max_tokens %d is not a multiple of block_length %d: pick one that divides it (e.g. %d)",
                           g->gen_length, g->block_length, b);
    }
    n_blocks = g->gen_length / g->block_length;
    if (!block_diffusion && counted && g->steps % n_blocks)
        return bad_request(err, "steps", "invalid_value", "steps %d is not a multiple of the %d blocks (max_tokens %d / block_length %d): pass steps %d",
                           g->steps, n_blocks, g->gen_length, g->block_length, (g->steps / n_blocks + 1) * n_blocks);
    if (g->remasking == DLLM_REMASK_ORIGIN && (given->threshold || given->factor))
        return bad_request(err, given->threshold ? "threshold" : "factor", "invalid_value",
                           "remasking origin commits by Dream's timestep schedule, which '%s' replaces", given->threshold ? "threshold" : "factor");
    if (g->remasking == DLLM_REMASK_ORIGIN && g->confidence_eos_eot_inf)
        return bad_request(err, "eos_eot_last", "invalid_value", "remasking origin ranks nothing, so eos_eot_last cannot apply");
    if (g->alg_temp > 0 && (given->threshold || given->factor || g->remasking == DLLM_REMASK_ORIGIN))
        return bad_request(err, "alg_temp", "invalid_value", "'alg_temp' samples the positions of a counted step, and this schedule has none");
    if (g->unmask == DLLM_UNMASK_THRESHOLD && g->remasking != DLLM_REMASK_ENTROPY && !(g->threshold > 0 && g->threshold <= 1))
        return bad_request(err, "threshold", "invalid_value", "'threshold' must be in (0, 1] (or <= 0 with remasking entropy)");
    if (g->unmask == DLLM_UNMASK_THRESHOLD && g->remasking == DLLM_REMASK_ENTROPY && !(g->threshold <= 0))
        return bad_request(err, "threshold", "invalid_value", "with remasking entropy the confidence is minus the entropy: 'threshold' must be <= 0");
    r->mask_id = g->mask_id >= 0 ? g->mask_id : srv->info.mask_id;
    r->eos_id = g->eos_id >= 0 ? g->eos_id : srv->info.eos_id;
    r->eot_id = g->eot_id >= 0 ? g->eot_id : srv->info.eot_id;
    if (block_diffusion && srv->info.stop_id >= 0) r->eot_id = srv->info.stop_id;
    if (g->early_stop && r->eos_id < 0 && r->eot_id < 0) {
        if (given->early_stop) return bad_request(err, "early_stop", "invalid_value", "'early_stop' needs an EOS or EoT token and the model names none");
        g->early_stop = 0;
    }
    /* a fresh seed only where something is drawn; otherwise it changes nothing and stays 0 (as the CLI) */
    if (r->seed_drawn) {
        r->seed_drawn = g->temperature > 0 || g->remasking == DLLM_REMASK_RANDOM || g->remasking == DLLM_REMASK_ORIGIN || g->alg_temp > 0 ||
                        g->dpad != DLLM_DPAD_OFF;
        if (r->seed_drawn) g->seed = fresh_seed();
    }
    r->out_capacity = g->gen_length + 1;  /* + 1: block diffusion may end with an AR seed */
    return 0;
}

/* ---- stop strings and the OpenAI fields dllm does not offer -------------------------------------------------- */

static int parse_stops(const cJSON *body, api_request *r, api_error *err) {
    const cJSON *stop = field(body, "stop"), *item;
    if (!stop) return 0;
    if (cJSON_IsString(stop)) {
        if (!*stop->valuestring) return bad_request(err, "stop", "invalid_value", "'stop' strings must not be empty");
        if (!(r->stops[0] = strdup(stop->valuestring))) return out_of_memory(err);
        r->n_stops = 1;
        return 0;
    }
    if (!cJSON_IsArray(stop)) return bad_request(err, "stop", "invalid_type", "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(stop) > API_MAX_STOPS) return bad_request(err, "stop", "invalid_value", "at most %d 'stop' strings", API_MAX_STOPS);
    cJSON_ArrayForEach(item, stop) {
        if (!cJSON_IsString(item) || !*item->valuestring) return bad_request(err, "stop", "invalid_type", "'stop' must hold non-empty strings");
        if (!(r->stops[r->n_stops] = strdup(item->valuestring))) return out_of_memory(err);
        r->n_stops++;
    }
    return 0;
}

/* Fields whose non-default values dllm cannot honour: refused, not ignored, so that a client is not misled. */
static int refuse_unsupported(const cJSON *body, api_error *err) {
    static const char *const zero_only[] = {"presence_penalty", "frequency_penalty"};
    static const char *const false_only[] = {"logprobs", "echo"};
    static const char *const absent_only[] = {"tools", "functions", "logit_bias", "suffix", "top_logprobs"};
    size_t i;
    for (i = 0; i < sizeof zero_only / sizeof zero_only[0]; i++) {
        const cJSON *f = field(body, zero_only[i]);
        if (f && !cJSON_IsNumber(f)) return bad_request(err, zero_only[i], "invalid_type", "'%s' must be a number", zero_only[i]);
        if (f && f->valuedouble != 0) return bad_request(err, zero_only[i], "unsupported_value", "'%s' is not supported by dllm: pass 0 or leave it out", zero_only[i]);
    }
    for (i = 0; i < sizeof false_only / sizeof false_only[0]; i++) {
        const cJSON *f = field(body, false_only[i]);
        if (f && cJSON_IsNumber(f) && f->valuedouble == 0) continue;  /* the legacy logprobs: 0 */
        if (f && !cJSON_IsFalse(f)) return bad_request(err, false_only[i], "unsupported_value", "'%s' is not supported by dllm: leave it out", false_only[i]);
    }
    for (i = 0; i < sizeof absent_only / sizeof absent_only[0]; i++)
        if (field(body, absent_only[i])) return bad_request(err, absent_only[i], "unsupported_value", "'%s' is not supported by dllm", absent_only[i]);
    return 0;
}

/* ---- prompts ------------------------------------------------------------------------------------------------- */

static int tokenize_text(const server *srv, const char *text, size_t len, api_request *r, api_error *err) {
    int n = 0;
    dllm_status st = dllm_tokenize(srv->tok, text, len, 1, NULL, 0, &n);
    if (st != DLLM_OK && st != DLLM_ERR_BUFFER_TOO_SMALL)
        return bad_request(err, r->chat ? "messages" : "prompt", "invalid_value", "the prompt does not tokenize: %s", dllm_last_error());
    if (!(r->prompt = (int32_t *)malloc(sizeof(int32_t) * (size_t)(n > 0 ? n : 1))))
        return out_of_memory(err);
    if (dllm_tokenize(srv->tok, text, len, 1, r->prompt, n, &r->n_prompt) != DLLM_OK) {
        free(r->prompt);
        r->prompt = NULL;
        return (api_error_set(err, 500, "server_error", NULL, NULL, "tokenizing failed: %s", dllm_last_error()), -1);
    }
    return 0;
}

/* A message's content: a string, or an array of {"type": "text", "text": ...} parts joined (malloc'ed into *out). */
static int message_content(const cJSON *content, char **out, api_error *err) {
    const cJSON *part;
    size_t len = 0;
    if (!content) { *out = strdup(""); return *out ? 0 : out_of_memory(err); }
    if (cJSON_IsString(content)) { *out = strdup(content->valuestring); return *out ? 0 : out_of_memory(err); }
    if (!cJSON_IsArray(content)) return bad_request(err, "messages", "invalid_type", "a message's 'content' must be a string or an array of text parts");
    cJSON_ArrayForEach(part, content) {
        const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type"), *text = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text))
            return bad_request(err, "messages", "invalid_type", "only text content parts ({\"type\": \"text\", \"text\": ...}) are supported");
        len += strlen(text->valuestring);
    }
    if (!(*out = (char *)malloc(len + 1))) return out_of_memory(err);
    **out = 0;
    cJSON_ArrayForEach(part, content) strcat(*out, cJSON_GetObjectItemCaseSensitive(part, "text")->valuestring);
    return 0;
}

/* messages through the model's chat template (assistant turn opened), as dllm-generate -p does. */
static int chat_prompt(const server *srv, const cJSON *body, api_request *r, api_error *err) {
    const cJSON *messages = cJSON_GetObjectItemCaseSensitive(body, "messages"), *m;
    dllm_chat_message *msgs = NULL;
    char *rendered = NULL;
    size_t len = 0;
    int n = 0, i, rc = -1;
    if (!messages) return bad_request(err, "messages", "missing_required_parameter", "'messages' is required");
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0)
        return bad_request(err, "messages", "invalid_type", "'messages' must be a non-empty array of {\"role\", \"content\"}");
    if (dllm_tokenizer_chat_template(srv->tok) == DLLM_CHAT_NONE)
        return bad_request(err, "messages", "unsupported_value", "this model has no known chat template: use /v1/completions with a raw prompt");
    if (!(msgs = (dllm_chat_message *)calloc((size_t)cJSON_GetArraySize(messages), sizeof *msgs)))
        return out_of_memory(err);
    cJSON_ArrayForEach(m, messages) {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(m, "role");
        char *content = NULL;
        if (!cJSON_IsObject(m) || !cJSON_IsString(role)) { bad_request(err, "messages", "invalid_type", "each message must be an object with a string 'role'"); goto done; }
        if (strcmp(role->valuestring, "system") && strcmp(role->valuestring, "developer") && strcmp(role->valuestring, "user") &&
            strcmp(role->valuestring, "assistant")) {
            bad_request(err, "messages", "invalid_value", "message role \"%.32s\" is not supported (system, developer, user, assistant)", role->valuestring);
            goto done;
        }
        if (message_content(field(m, "content"), &content, err)) goto done;
        /* the template knows system, user and assistant: OpenAI's developer role is the system role renamed */
        msgs[n].role = !strcmp(role->valuestring, "developer") || !strcmp(role->valuestring, "system") ? "system"
                       : !strcmp(role->valuestring, "user")                                          ? "user"
                                                                                                      : "assistant";
        msgs[n++].content = content;
    }
    dllm_chat_render(srv->tok, msgs, n, 1, NULL, 0, &len);
    if (!(rendered = (char *)malloc(len ? len : 1))) { api_error_set(err, 500, "server_error", NULL, NULL, "out of memory"); goto done; }
    if (dllm_chat_render(srv->tok, msgs, n, 1, rendered, len, &len) != DLLM_OK) {
        bad_request(err, "messages", "invalid_value", "the chat template cannot render these messages: %s", dllm_last_error());
        goto done;
    }
    rc = tokenize_text(srv, rendered, len - 1, r, err);
done:
    for (i = 0; i < n; i++) free((void *)msgs[i].content);
    free(msgs);
    free(rendered);
    return rc;
}

/* /v1/completions: a string tokenized as given (dllm-generate --raw), or an array of token ids. */
static int raw_prompt(const server *srv, const cJSON *body, api_request *r, api_error *err) {
    const cJSON *prompt = cJSON_GetObjectItemCaseSensitive(body, "prompt"), *item;
    int n = 0;
    if (!prompt) return bad_request(err, "prompt", "missing_required_parameter", "'prompt' is required");
    if (cJSON_IsArray(prompt) && cJSON_GetArraySize(prompt) == 1 && cJSON_IsString(cJSON_GetArrayItem(prompt, 0)))
        prompt = cJSON_GetArrayItem(prompt, 0);  /* a batch of one prompt */
    if (cJSON_IsString(prompt)) return tokenize_text(srv, prompt->valuestring, strlen(prompt->valuestring), r, err);
    if (!cJSON_IsArray(prompt) || cJSON_GetArraySize(prompt) == 0)
        return bad_request(err, "prompt", "invalid_type", "'prompt' must be a string or a non-empty array of token ids (one prompt a request)");
    if (!(r->prompt = (int32_t *)malloc(sizeof(int32_t) * (size_t)cJSON_GetArraySize(prompt))))
        return out_of_memory(err);
    cJSON_ArrayForEach(item, prompt) {
        if (!cJSON_IsNumber(item) || item->valuedouble != floor(item->valuedouble) || item->valuedouble < 0 || item->valuedouble >= srv->info.n_vocab) {
            free(r->prompt);
            r->prompt = NULL;
            return bad_request(err, "prompt", "invalid_value", "'prompt' ids must be integers in [0, %d)", srv->info.n_vocab);
        }
        r->prompt[n++] = (int32_t)item->valuedouble;
    }
    r->n_prompt = n;
    return 0;
}

/* ---- the whole request --------------------------------------------------------------------------------------- */

static int parse_body(const server *srv, const cJSON *body, api_request *r, api_error *err) {
    given_fields given;
    const char *model = NULL;
    const cJSON *opts;
    int i;
    memset(&given, 0, sizeof given);
    if (!cJSON_IsObject(body)) return bad_request(err, NULL, "invalid_type", "the request body must be a JSON object");
    if (get_string(body, "model", &model, err) < 0) return -1;
    if (model && strcmp(model, srv->model_id))
        return (api_error_set(err, 404, "invalid_request_error", "model", "model_not_found", "The model '%.128s' does not exist; this server serves '%s'",
                              model, srv->model_id), -1);
    if (refuse_unsupported(body, err) || get_bool(body, "stream", &r->stream, err) < 0 || get_bool(body, "dllm_canvas", &r->canvas, err) < 0 ||
        get_int(body, "n", 1, srv->cfg.max_n, &r->n_choices, err) < 0)
        return -1;
    if ((opts = field(body, "stream_options"))) {
        if (!cJSON_IsObject(opts)) return bad_request(err, "stream_options", "invalid_type", "'stream_options' must be an object");
        if (get_bool(opts, "include_usage", &r->include_usage, err) < 0) return -1;
    }
    if (r->canvas && !r->stream) return bad_request(err, "dllm_canvas", "invalid_value", "'dllm_canvas' events come in a stream: set 'stream' too");
    if (parse_gen_fields(srv, body, r, &given, err) || settle_schedule(srv, r, &given, err) || parse_stops(body, r, err)) return -1;
    if (r->chat ? chat_prompt(srv, body, r, err) : raw_prompt(srv, body, r, err)) return -1;
    if (r->n_prompt + r->gen.gen_length > srv->info.max_seq_len)
        return bad_request(err, "max_tokens", "context_length_exceeded",
                           "the prompt is %d tokens; with max_tokens %d that exceeds the model's context of %d: lower max_tokens or shorten the prompt",
                           r->n_prompt, r->gen.gen_length, srv->info.max_seq_len);
    if (r->gen.kv_cache != DLLM_KV_CACHE_NONE)
        for (i = 0; i < r->n_prompt; i++)
            if (r->prompt[i] == r->mask_id)
                return bad_request(err, "cache", "invalid_value", "the prompt holds the mask token (id %d), which 'cache' cannot decode", r->mask_id);
    return 0;
}

int api_parse_request(const server *srv, int chat, const char *body, size_t len, api_request *req, api_error *err) {
    cJSON *root;
    int rc;
    memset(req, 0, sizeof *req);
    req->chat = chat;
    req->n_choices = 1;
    req->gen = dllm_gen_default_params();
    req->gen.early_stop = 0;
    if (!(root = cJSON_ParseWithLength(body, len)))
        return bad_request(err, NULL, "invalid_json", "We could not parse the JSON body of your request (near byte %ld).",
                           cJSON_GetErrorPtr() ? (long)(cJSON_GetErrorPtr() - body) : -1L);
    rc = parse_body(srv, root, req, err);
    cJSON_Delete(root);
    if (rc) api_request_free(req);
    return rc;
}

void api_request_free(api_request *req) {
    int i;
    for (i = 0; i < req->n_stops; i++) free(req->stops[i]);
    req->n_stops = 0;
    free(req->prompt);
    req->prompt = NULL;
}
