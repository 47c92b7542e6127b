# Finds Debian's MLIR/LLVM 22 and sets up TableGen, without LLVM's global compile flags
# (HandleLLVMOptions is deliberately not included: it would leak -fno-exceptions and more
# into every target, the runtime's too). Everything links the shared libMLIR/libLLVM.
find_package(MLIR REQUIRED CONFIG HINTS /usr/lib/llvm-22/lib/cmake/mlir)
list(APPEND CMAKE_MODULE_PATH ${MLIR_CMAKE_DIR} ${LLVM_CMAKE_DIR})
include(TableGen)
include(AddLLVM)
include(AddMLIR)
include_directories(SYSTEM ${LLVM_INCLUDE_DIRS} ${MLIR_INCLUDE_DIRS})
set(HYBRIDCP_MLIR_LIBS MLIR LLVM)
set(LLVM_TOOLS_DIR ${LLVM_TOOLS_BINARY_DIR})
message(STATUS "MLIR ${LLVM_PACKAGE_VERSION} from ${MLIR_DIR}; LLVM tools in ${LLVM_TOOLS_BINARY_DIR}")

# Our compiler libraries: MLIR-facing code, built with LLVM's definitions.
function(hybridcp_compiler_library name)
  cmake_parse_arguments(ARG "" "" "SOURCES;DEPENDS;LINK" ${ARGN})
  add_library(${name} STATIC ${ARG_SOURCES})
  if(ARG_DEPENDS)
    add_dependencies(${name} ${ARG_DEPENDS})
  endif()
  target_compile_definitions(${name} PUBLIC ${LLVM_DEFINITIONS})
  target_link_libraries(${name} PUBLIC ${ARG_LINK} ${HYBRIDCP_MLIR_LIBS})
  hybridcp_target_defaults(${name})
endfunction()
