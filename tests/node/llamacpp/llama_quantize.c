/*
 * llama_quantize.c — llama.cpp's own quantizer (llama_model_quantize in node-llama-cpp's prebuilt
 * libllama), for making llama.cpp-written quantized files of kvgw's test models:
 *
 *   llama_quantize IN.gguf OUT.gguf q4_k_m|q4_0|q5_k_m|q8_0
 *
 * llama_quantize.sh compiles and runs it (the header comes from the llama.cpp source bundled in
 * node-llama-cpp, so it matches the library). Exit status 0, 1 on a failure, 2 on bad usage.
 */
#include <stdio.h>
#include <string.h>

#include "llama.h"

int main(int argc, char **argv)
{
    static const struct {
        const char *name;
        enum llama_ftype ftype;
    } types[] = {{"q4_k_m", LLAMA_FTYPE_MOSTLY_Q4_K_M},
                 {"q4_0", LLAMA_FTYPE_MOSTLY_Q4_0},
                 {"q5_k_m", LLAMA_FTYPE_MOSTLY_Q5_K_M},
                 {"q8_0", LLAMA_FTYPE_MOSTLY_Q8_0}};
    if (argc != 4) {
        fprintf(stderr, "usage: llama_quantize IN.gguf OUT.gguf q4_k_m|q4_0|q5_k_m|q8_0\n");
        return 2;
    }
    struct llama_model_quantize_params p = llama_model_quantize_default_params();
    size_t i;
    for (i = 0; i < sizeof types / sizeof types[0]; i++)
        if (strcmp(argv[3], types[i].name) == 0)
            break;
    if (i == sizeof types / sizeof types[0]) {
        fprintf(stderr, "llama_quantize: unknown type '%s'\n", argv[3]);
        return 2;
    }
    p.ftype = types[i].ftype;
    p.nthread = 2;
    llama_backend_init();
    uint32_t rc = llama_model_quantize(argv[1], argv[2], &p);
    llama_backend_free();
    if (rc != 0) {
        fprintf(stderr, "llama_quantize: llama_model_quantize failed (%u)\n", rc);
        return 1;
    }
    return 0;
}
