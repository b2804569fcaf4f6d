# qrt_python_endpoint(NAME <command> DESCRIPTION <text>): what a Python
# endpoint program of this room installs beside its distribution: its
# systemd unit and sysusers.d entry (from endpoint.service.in and
# endpoint.sysusers.in, the room's one template of each), its example
# /etc/qrtd/<command>.env (a conffile) and its man page <command>.8; the
# distribution itself, with its pinned requirements, under
# /usr/share/qrtd/python/<command>, for endpoint-venv.sh.  Component
# "endpoints".
function(qrt_python_endpoint)
  cmake_parse_arguments(E "" "NAME;DESCRIPTION" "" ${ARGN})
  set(NAME ${E_NAME})
  set(DESCRIPTION ${E_DESCRIPTION})
  set(_room ${CMAKE_CURRENT_FUNCTION_LIST_DIR})
  configure_file(${_room}/endpoint.service.in ${CMAKE_CURRENT_BINARY_DIR}/${NAME}.service @ONLY)
  configure_file(${_room}/endpoint.sysusers.in ${CMAKE_CURRENT_BINARY_DIR}/${NAME}.sysusers @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${NAME}.service DESTINATION lib/systemd/system COMPONENT endpoints)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/${NAME}.sysusers DESTINATION lib/sysusers.d RENAME ${NAME}.conf
          COMPONENT endpoints)
  install(FILES ${NAME}.8 DESTINATION ${CMAKE_INSTALL_MANDIR}/man8 COMPONENT endpoints)
  install(FILES pyproject.toml requirements.txt DESTINATION ${CMAKE_INSTALL_DATADIR}/qrtd/python/${NAME}
          COMPONENT endpoints)
  string(REPLACE "-" "_" _module ${NAME})
  install(DIRECTORY src/${_module} DESTINATION ${CMAKE_INSTALL_DATADIR}/qrtd/python/${NAME}/src
          COMPONENT endpoints FILES_MATCHING PATTERN "*.py" PATTERN "py.typed" PATTERN "__pycache__" EXCLUDE)
  # /etc/qrtd for prefix /usr (as config/CMakeLists.txt chooses it), at install time
  install(CODE "
    if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\" OR CMAKE_INSTALL_PREFIX STREQUAL \"/\")
      set(_etc \"/etc\")
    else()
      set(_etc \"\${CMAKE_INSTALL_PREFIX}/etc\")
    endif()
    file(INSTALL DESTINATION \"\${_etc}/qrtd\" TYPE FILE FILES \"${CMAKE_CURRENT_SOURCE_DIR}/${NAME}.env\")
  " COMPONENT endpoints)
endfunction()
