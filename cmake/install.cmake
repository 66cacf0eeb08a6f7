# `cmake --install`: the public headers, the static libraries, the `shardcheck` CLI and a CMake
# package (find_package(shardcheck CONFIG)) exporting shardcheck::comm, ::sim, ::reference,
# ::parallel, ::mp, ::checkpoint and, where gpu/ was built, ::gpu (and ::gpu_mpi).
include(CMakePackageConfigHelpers)
set(_pkg_dir ${CMAKE_INSTALL_LIBDIR}/cmake/shardcheck)

# The public API: what a C++ user includes to write a strategy against comm::Communicator, run it
# on sim::SimWorld, check it against ref:: and checkpoint it. Every header these include is
# installed with them (the closure below), so each installed header compiles on its own; test-only
# and harness headers are not installed.
set(SHARDCHECK_PUBLIC_HEADERS
  comm/communicator.hpp comm/mesh.hpp
  sim/world.hpp
  reference/config.hpp reference/data.hpp reference/model.hpp reference/trainer.hpp
  reference/optim.hpp
  parallel/parity.hpp parallel/flops.hpp parallel/ledger.hpp parallel/mp/mesh_engine.hpp
  parallel/mp/mesh_ledger.hpp
  checkpoint/checkpoint.hpp)
if(TARGET shardcheck_gpu)
  list(APPEND SHARDCHECK_PUBLIC_HEADERS gpu/nccl_communicator.hpp gpu/bootstrap.hpp)
  if(TARGET shardcheck_gpu_mpi)
    list(APPEND SHARDCHECK_PUBLIC_HEADERS gpu/mpi_bootstrap.hpp)
  endif()
endif()

# Follows #include "x/y.hpp" lines from the public headers to every project header they reach.
set(_todo ${SHARDCHECK_PUBLIC_HEADERS})
set(_installed "")
while(_todo)
  list(POP_FRONT _todo _h)
  if(_h IN_LIST _installed OR NOT EXISTS ${PROJECT_SOURCE_DIR}/${_h})
    continue()
  endif()
  list(APPEND _installed ${_h})
  file(STRINGS ${PROJECT_SOURCE_DIR}/${_h} _lines REGEX "^#include \"[^\"]+\"")
  foreach(_l IN LISTS _lines)
    string(REGEX REPLACE "^#include \"([^\"]+)\".*" "\\1" _inc "${_l}")
    list(APPEND _todo ${_inc})
  endforeach()
endwhile()
list(SORT _installed)
foreach(_h IN LISTS _installed)
  get_filename_component(_dir ${_h} DIRECTORY)
  install(FILES ${PROJECT_SOURCE_DIR}/${_h} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/shardcheck/${_dir})
endforeach()

# Exported names: shardcheck_comm -> shardcheck::comm, ... The warning flags are link-only
# dependencies of the static libraries, so they are exported too (they add nothing to a consumer).
set(_targets shardcheck_warnings shardcheck_files shardcheck_comm shardcheck_sim shardcheck_reference
             shardcheck_parallel shardcheck_checkpoint shardcheck_mp)
get_property(_mp_parts DIRECTORY ${PROJECT_SOURCE_DIR}/parallel/mp PROPERTY BUILDSYSTEM_TARGETS)
list(FILTER _mp_parts INCLUDE REGEX "^shardcheck_mp_")
list(APPEND _targets ${_mp_parts})
set(SHARDCHECK_EXPORTS_GPU OFF)
set(SHARDCHECK_EXPORTS_GPU_MPI OFF)
if(TARGET shardcheck_gpu)
  list(APPEND _targets shardcheck_gpu shardcheck_cuda_warnings)
  set(SHARDCHECK_EXPORTS_GPU ON)
  if(TARGET shardcheck_gpu_mpi)
    list(APPEND _targets shardcheck_gpu_mpi)
    set(SHARDCHECK_EXPORTS_GPU_MPI ON)
  endif()
endif()
foreach(_t IN LISTS _targets)
  string(REGEX REPLACE "^shardcheck_" "" _name ${_t})
  set_target_properties(${_t} PROPERTIES EXPORT_NAME ${_name})
endforeach()
install(TARGETS ${_targets} EXPORT shardcheckTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS shardcheck RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(EXPORT shardcheckTargets NAMESPACE shardcheck:: DESTINATION ${_pkg_dir})

configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/shardcheckConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/shardcheckConfig.cmake INSTALL_DESTINATION ${_pkg_dir})
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/shardcheckConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/shardcheckConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/shardcheckConfigVersion.cmake
        DESTINATION ${_pkg_dir})
