# Project-wide compile settings, applied per target through stableflash_target_defaults().
function(stableflash_target_defaults target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wno-unknown-pragmas>
    # GCC 12 reports impossible overlaps inside std::string's operator+ (GCC bug 105329, fixed in 13).
    $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>
    # Rounding-point emulation must be bit exact: no fused multiply-add contraction, on the host
    # as on the device (the device side uses explicit __fmul_rn/__fadd_rn where it matters).
    $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>
    $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo --ptxas-options=--warn-on-spills -Xcompiler=-ffp-contract=off>)
  target_include_directories(${target} PUBLIC ${PROJECT_SOURCE_DIR}/include)
endfunction()
