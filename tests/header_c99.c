/* Compiled as C99 (-std=c99 -pedantic): the public header must be valid C, not only C++. */
#include "../dllm.h"

#include <string.h>

int dllm_test_header_c99(void);

int dllm_test_header_c99(void) {
    dllm_model_params mp = dllm_model_default_params();
    dllm_ctx_params cp = dllm_ctx_default_params();
    dllm_gen_params gp = dllm_gen_default_params();
    dllm_model *model = NULL;
    if (mp.use_mmap != 1 || cp.backend != DLLM_BACKEND_AUTO || gp.block_length != 32) return 1;
    if (dllm_model_load(NULL, mp, &model) != DLLM_ERR_INVALID_ARGUMENT || model != NULL) return 2;
    if (strcmp(dllm_status_str(DLLM_ERR_SHAPE), "DLLM_ERR_SHAPE") != 0) return 3;
    return 0;
}
