# lit configuration for hybridcp: FileCheck tests of the dialects, passes and command line.
import os

import lit.formats

config.name = "hybridcp"
config.test_format = lit.formats.ShTest(execute_external=True)
config.suffixes = [".mlir", ".test"]
config.excludes = ["CMakeLists.txt", "lit.cfg.py", "lit.site.cfg.py", "Inputs"]
config.substitutions.append(("%tool_inputs", os.path.join(os.path.dirname(__file__), "tools", "Inputs")))
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = config.hybridcp_obj_root

# Our tools first, then LLVM's (FileCheck, not, count).
path = os.pathsep.join([config.hybridcp_tools_dir, config.llvm_tools_dir, config.environment.get("PATH", os.environ["PATH"])])
config.environment["PATH"] = path
config.substitutions.append(("%src_root", config.hybridcp_src_root))
config.substitutions.append(("%inputs", os.path.join(config.test_source_root, "Inputs")))
config.substitutions.append(("%fixtures", os.path.join(config.hybridcp_src_root, "tests/fixtures")))
# --enable-var-scope: captured names do not leak across CHECK-LABELs.
config.environment["FILECHECK_OPTS"] = "--enable-var-scope"
# Built with the CUDA backend (the `bench` command): tests that need it say REQUIRES: cuda.
if getattr(config, "hybridcp_cuda", False):
    config.available_features.add("cuda")
