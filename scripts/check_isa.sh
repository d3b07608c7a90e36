#!/usr/bin/env bash
# scripts/check_isa.sh BUILD_DIR — the object code of a default build (LOOM_CPU_BASELINE
# x86-64-v3) uses AVX-512 only inside the kernels dispatched by cpuid (Note [CPU instruction
# sets] in tensor/cpu_info.h), so that it runs on a CPU with AVX2 and no AVX-512. Disassembles
# loom's libraries and apps, and lists every function that touches an AVX-512 register (zmm,
# the mask registers k1-k7, xmm16-31/ymm16-31, which only EVEX encodes) or an AMX tile (tmm);
# fails on any outside the allowed ones: the AVX-512 and AMX micro-kernels (Kernel<...,
# CpuIsa::kAvx512...> and Kernel<..., CpuIsa::kAmxBf16>: the float one, bfloat16's vdpbf16ps
# one and its tile one), the direct 3x3 convolution's AVX-512 code (avx512::forward_tile,
# weight_tile, pad_images, and stride 2's pad_phases and interleave_phases: conv_direct.cpp runs
# them where cpu_isa() has AVX-512), the micro-kernels' edge tiles (edge_tile_12x32 and
# dot_edge_tile_12x32, reached only through those kernels' edge_kernel; the vdpbf16ps kernel's
# sum over segments, dot_segments_rows_x32, which conv_bf16.cpp calls only where it runs),
# bfloat16 convolutions' packers (avx512::pack_patch_pairs, pack_patch_columns and
# pack_lane_weights: conv_bf16.cpp runs them only on the vdpbf16ps kernel) and the peaks
# (chains_512, chains_bf16_512, chains_amx and their helper).
set -euo pipefail
build=${1:?usage: scripts/check_isa.sh BUILD_DIR}
allowed='Kernel<([a-z]+|loom::BFloat16), \(loom::CpuIsa\)[234]>::|chains_(bf16_512|512|amx)\(long\)|first_lane\(float __vector\(16\)\)|::avx512::(forward_tile|weight_tile|pad_images|pad_phases|interleave_phases|pack_patch_pairs|pack_patch_columns|pack_lane_weights)[<(]|loom::cpu::(dot_)?edge_tile_12x32<[48]>\(|loom::cpu::dot_segments_rows_x32<(4|8|12)>\('
# The libraries (the real files, not their links) and the apps' executables.
mapfile -t objects < <(find "$build" -maxdepth 3 -type f \( -name 'libloom*.so*' -o \
  \( -path '*/apps/*' -perm -u+x \) \) ! -name '*.cmake' | sort)
[[ ${#objects[@]} -gt 0 ]] || { echo "check_isa: no libraries or apps under $build"; exit 1; }
bad=0
seen=0
for object in "${objects[@]}"; do
  [[ $(head -c 4 "$object" | od -An -c | tr -d ' ') == 177ELF ]] || continue
  while IFS= read -r fn; do
    seen=$((seen + 1))
    if [[ $fn =~ $allowed ]]; then
      echo "allowed: ${object##*/}: $fn"
    else
      echo "AVX-512 outside the dispatched kernels: ${object##*/}: $fn"
      bad=1
    fi
  done < <(objdump -d --no-show-raw-insn -C "$object" |
    awk '/^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<")) }
         /%zmm|%k[1-7]|%[xy]mm(1[6-9]|2[0-9]|3[01])|%tmm[0-7]/ { if (fn != last) print fn; last = fn }')
done
echo "check_isa: ${#objects[@]} objects, $seen functions with AVX-512 registers"
exit $bad
