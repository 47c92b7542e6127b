# Test and benchmark of the CUDA sequence kernels against the CPU oracle (needs a GPU to run; not
# registered with ctest, which also runs on GPU-less machines). include()d from
# tests/cuda/CMakeLists.txt after runtime/kernels/cuda/Sequence.cmake. On the GPU machines, which
# have no Abseil and so cannot configure the whole project, use scripts/gpu/run_sequence_tests.sh.
add_executable(test_sequence_kernels ${CMAKE_CURRENT_LIST_DIR}/test_sequence_kernels.cu)
find_package(Threads REQUIRED)
target_link_libraries(test_sequence_kernels PRIVATE hcp_kernels_cuda_sequence Threads::Threads)
set_target_properties(test_sequence_kernels PROPERTIES CUDA_ARCHITECTURES 90)
if(TARGET hcp_kernels_cpu)
  # Inside the project: the oracle library (with the real Abseil).
  target_link_libraries(test_sequence_kernels PRIVATE hcp_kernels_cpu)
else()
  # Standalone: compile just the oracle files the test calls, with the Abseil shim.
  target_sources(test_sequence_kernels PRIVATE
    ${hcp_seq_repo_root}/runtime/kernels/cpu/SsdScan.cpp
    ${hcp_seq_repo_root}/runtime/kernels/cpu/SsdScanBackward.cpp
    ${hcp_seq_repo_root}/runtime/kernels/cpu/SsdInitialState.cpp
    ${hcp_seq_repo_root}/runtime/kernels/cpu/Attention.cpp)
  target_include_directories(test_sequence_kernels PRIVATE ${CMAKE_CURRENT_LIST_DIR}/shim)
endif()
