#include "dialects/model/ModelDialect.h"

#include "dialects/model/ModelDialect.cpp.inc"
#include "dialects/model/ModelEnums.cpp.inc"
#include "dialects/model/ModelOps.h"

namespace hcp::model {

void ModelDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "dialects/model/ModelOps.cpp.inc"
      >();
}

}  // namespace hcp::model
