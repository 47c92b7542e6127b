# Sequence-mixing CUDA kernels: the Mamba2 SSD scan (and its initial-state correction) and causal
# GQA attention (SequenceKernels.h).
# include()d from runtime/kernels/cuda/CMakeLists.txt. Callers include runtime/kernels/cuda/SequenceKernels.h (plain C++, needs the CUDA
# runtime headers). Built for sm_90a: the mma.sync kernels run on any sm_90 part, and
# AttentionHopper.cu uses the sm_90a-only wgmma and setmaxnreg (plus TMA through the driver's
# cuTensorMapEncodeTiled, looked up at run time: no link against libcuda).
get_filename_component(hcp_seq_repo_root ${CMAKE_CURRENT_LIST_DIR}/../../.. ABSOLUTE)
add_library(hcp_kernels_cuda_sequence STATIC
  ${CMAKE_CURRENT_LIST_DIR}/SsdScan.cu
  ${CMAKE_CURRENT_LIST_DIR}/SsdScanBackward.cu
  ${CMAKE_CURRENT_LIST_DIR}/SsdInitialState.cu
  ${CMAKE_CURRENT_LIST_DIR}/SsdInitialStateBackward.cu
  ${CMAKE_CURRENT_LIST_DIR}/Attention.cu
  ${CMAKE_CURRENT_LIST_DIR}/AttentionBackward.cu
  ${CMAKE_CURRENT_LIST_DIR}/AttentionHopper.cu
)
target_include_directories(hcp_kernels_cuda_sequence PUBLIC ${hcp_seq_repo_root})
target_link_libraries(hcp_kernels_cuda_sequence PUBLIC CUDA::cudart)
set_target_properties(hcp_kernels_cuda_sequence PROPERTIES CUDA_ARCHITECTURES 90a)
target_compile_options(hcp_kernels_cuda_sequence PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo -Xcompiler=-Wall,-Wextra -Xptxas=-warn-spills>)
