# Test and benchmark of the CUDA sequence kernels against the CPU oracle (needs a GPU to run; not
# registered with ctest, which also runs on GPU-less machines). include()d from
# tests/cuda/CMakeLists.txt after runtime/kernels/cuda/Sequence.cmake. scripts/gpu/make_bundle.sh
# builds it into the bundle; scripts/gpu/run_sequence_tests.sh runs it on a GPU machine.
add_executable(test_sequence_kernels ${CMAKE_CURRENT_LIST_DIR}/test_sequence_kernels.cu)
find_package(Threads REQUIRED)
target_link_libraries(test_sequence_kernels PRIVATE hcp_kernels_cuda_sequence Threads::Threads)
set_target_properties(test_sequence_kernels PROPERTIES CUDA_ARCHITECTURES 90)
# The oracle: the CPU kernels.
target_link_libraries(test_sequence_kernels PRIVATE hcp_kernels_cpu)
