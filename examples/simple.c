/* simple.c - text in, text out: load a model directory, apply its chat template, tokenize, generate, print.
 *   cc -std=c99 simple.c $(pkg-config --cflags --libs dllm) -o simple    (or: nvcc ... simple.c dllm_cuda.cu)
 *   ./simple -m models/tiny-llada "What is 2+2?"                                                              */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "dllm.h"

/* 1 if s is DLLM_OK (or, for a size query, BUFFER_TOO_SMALL); else prints the status and its detail. */
static int ok(dllm_status s, int size_query, const char *what) {
    if (s == DLLM_OK || (size_query && s == DLLM_ERR_BUFFER_TOO_SMALL)) return 1;
    fprintf(stderr, "%s: %s: %s\n", what, dllm_status_str(s), dllm_last_error());
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4 || strcmp(argv[1], "-m") != 0) {
        fprintf(stderr, "usage: %s -m MODEL_DIR \"prompt\"\n", argv[0]);
        return 2;
    }
    const char *dir = argv[2], *prompt = argv[3];
    dllm_model *model = NULL; dllm_tokenizer *tok = NULL; dllm_ctx *ctx = NULL; dllm_model_info info;
    char *text = NULL, *answer = NULL; int32_t *ids = NULL, *out = NULL;
    size_t len = strlen(prompt), n_text = 0; int n_ids = 0, n_out = 0, rc = 1;
    dllm_gen_params gp = dllm_gen_default_params();  /* greedy, block 32 */
    gp.gen_length = 64; gp.steps = 64;
    const int cap = gp.gen_length + 1;  /* + 1: a block-diffusion answer may end with one more id */

    if (!ok(dllm_model_load(dir, dllm_model_default_params(), &model), 0, "load") ||
        !ok(dllm_model_get_info(model, &info), 0, "info") || !ok(dllm_tokenizer_load(dir, &tok), 0, "tokenizer") ||
        !ok(dllm_ctx_create(model, dllm_ctx_default_params(), &ctx), 0, "context")) goto done;  /* GPU if usable */

    if (dllm_tokenizer_chat_template(tok) != DLLM_CHAT_NONE) {  /* a model without one (tiny-add) takes raw text */
        dllm_chat_message msg = {"user", prompt};
        if (!ok(dllm_chat_render(tok, &msg, 1, 1, NULL, 0, &len), 1, "chat") || !(text = (char *)malloc(len)) ||
            !ok(dllm_chat_render(tok, &msg, 1, 1, text, len, &len), 0, "chat")) goto done;
        prompt = text; len -= 1;  /* len counted the NUL */
    }
    if (!ok(dllm_tokenize(tok, prompt, len, 1, NULL, 0, &n_ids), 1, "tokenize") ||
        !(ids = (int32_t *)malloc(sizeof *ids * (n_ids + 1))) ||
        !ok(dllm_tokenize(tok, prompt, len, 1, ids, n_ids, &n_ids), 0, "tokenize")) goto done;

    gp.early_stop = info.block_size == 0;  /* on, as dllm-generate has it (the library's default is off);
                                              block-diffusion models stop by themselves and reject it */
    if (!(out = (int32_t *)malloc(sizeof *out * cap)) ||
        !ok(dllm_generate(ctx, ids, n_ids, gp, out, cap, &n_out, NULL), 0, "generate")) goto done;

    if (!ok(dllm_detokenize(tok, out, n_out, 1, NULL, 0, &n_text), 1, "detokenize") ||
        !(answer = (char *)malloc(n_text)) ||
        !ok(dllm_detokenize(tok, out, n_out, 1, answer, n_text, &n_text), 0, "detokenize")) goto done;
    printf("%s\n", answer);
    rc = 0;
done:
    free(answer); free(out); free(ids); free(text);
    dllm_ctx_free(ctx); dllm_tokenizer_free(tok); dllm_model_free(model);
    return rc;
}
