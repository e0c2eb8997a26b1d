# fuzz_quant: quantized tensors (Q4_0, Q8_0, Q4_K, Q5_K, Q6_K) with hostile sizes and scale bytes,
# in a GGUF file or as raw blocks -> dequantization, activation quantization, dot products and
# re-quantization, all inside the bytes. Seeds in corpus/fuzz_quant/: small GGUF files with one
# tensor of each type (written by kvgw's quantizer) and raw blocks with extreme scales.
kvgw_add_fuzzer(NAME fuzz_quant
    SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/fuzz_quant.c
    LIBS kvgw_engine kvgw_engine_internal
    CORPUS ${CMAKE_CURRENT_SOURCE_DIR}/corpus/fuzz_quant
    SECONDS 30)
