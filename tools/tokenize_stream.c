/* tokenize_stream: dllm's tokenizer behind a binary pipe, for tools/tokenizer_diff.py.
 *
 *   tokenize_stream DIR < records > results
 *
 * Each record on stdin is a little-endian u32 byte count with its high bit set when special tokens are
 * to be parsed, then the bytes; each result is a u32 id count (0xFFFFFFFF on error) then the int32 ids.
 * Written in C99 against dllm.h only. */
#include "../dllm.h"

#include <stdio.h>
#include <stdlib.h>

static int read_u32(uint32_t *v) {
    unsigned char b[4];
    if (fread(b, 1, 4, stdin) != 4) return 0;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 1;
}

int main(int argc, char **argv) {
    dllm_tokenizer *tok = NULL;
    if (argc != 2) { fprintf(stderr, "usage: tokenize_stream DIR < records > results\n"); return 2; }
    if (dllm_tokenizer_load(argv[1], &tok) != DLLM_OK) { fprintf(stderr, "tokenize_stream: %s\n", dllm_last_error()); return 1; }
    size_t cap_text = 0, cap_ids = 0;
    char *text = NULL;
    int32_t *ids = NULL;
    uint32_t head;
    while (read_u32(&head)) {
        size_t n = head & 0x7FFFFFFFu;
        int parse_special = (head >> 31) != 0, n_ids = 0;
        if (n > cap_text && !(text = (char *)realloc(text, cap_text = n))) return 1;
        if (n && fread(text, 1, n, stdin) != n) return 1;
        dllm_status s = dllm_tokenize(tok, text, n, parse_special, NULL, 0, &n_ids);
        if (s == DLLM_ERR_BUFFER_TOO_SMALL) {
            if ((size_t)n_ids > cap_ids && !(ids = (int32_t *)realloc(ids, (cap_ids = (size_t)n_ids) * sizeof *ids))) return 1;
            s = dllm_tokenize(tok, text, n, parse_special, ids, n_ids, &n_ids);
        }
        uint32_t count = s == DLLM_OK ? (uint32_t)n_ids : 0xFFFFFFFFu;
        fwrite(&count, 4, 1, stdout);  /* x86: little-endian */
        if (s == DLLM_OK && n_ids) fwrite(ids, sizeof *ids, (size_t)n_ids, stdout);
    }
    free(text);
    free(ids);
    dllm_tokenizer_free(tok);
    return 0;
}
