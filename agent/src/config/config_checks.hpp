#pragma once
// The syntax checks of the option table's rows (config_table.cpp): each
// takes an option's text and returns what is wrong with it, or nothing.
// Pure functions, no host access.  Private to qrt_config.

#include <optional>
#include <string>
#include <string_view>

namespace qrt::config_checks {

std::optional<std::string> check_absolute_path(std::string_view text);
std::optional<std::string> check_optional_absolute_path(std::string_view text);
std::optional<std::string> check_socket_path(std::string_view text);
std::optional<std::string> check_tcp_listen(std::string_view text);
std::optional<std::string> check_tcp_alias(std::string_view text);
std::optional<std::string> check_group_name(std::string_view text);
std::optional<std::string> check_optional_group_name(std::string_view text);
std::optional<std::string> check_user_name(std::string_view text);
std::optional<std::string> check_octal_mode(std::string_view text);
std::optional<std::string> check_principal(std::string_view text);
std::optional<std::string> check_priority_ceiling(std::string_view text);
std::optional<std::string> check_endpoint(std::string_view text);
bool looks_like_pci_id(std::string_view text);
std::optional<std::string> check_device_name(std::string_view text);
std::optional<std::string> check_runtime_knob(std::string_view text);
std::optional<std::string> check_qpu_name(std::string_view text);

}  // namespace qrt::config_checks
