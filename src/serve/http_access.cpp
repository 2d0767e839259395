// AccessPolicy: API keys, CORS, JSON-only POSTs (see http_access.h).
#include "serve/http_access.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include <algorithm>
#include <fstream>
#include <stdexcept>

#include "serve/request.h"
#include "serve/http_guard.h"
#include "serve/api_json.h"

namespace cf {

namespace {

std::array<unsigned char, 32> sha256(std::string_view s) {
  std::array<unsigned char, 32> d{};
  unsigned int n = 0;
  if (EVP_Digest(s.data(), s.size(), d.data(), &n, EVP_sha256(), nullptr) != 1 || n != d.size())
    throw std::runtime_error("SHA-256 failed (OpenSSL)");
  return d;
}

std::string_view trim(std::string_view s) {
  const auto b = s.find_first_not_of(" \t\r\n");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

bool iequals_prefix(std::string_view s, std::string_view prefix) {
  return s.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), s.begin(), [](char a, char b) {
           return std::tolower(static_cast<unsigned char>(a)) == std::tolower(static_cast<unsigned char>(b));
         });
}

}  // namespace

std::vector<std::string> read_api_key_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read API key file " + path);
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(f, line)) {
    const std::string_view k = trim(line);
    if (k.empty() || k.front() == '#') continue;
    keys.emplace_back(k);
  }
  if (keys.empty()) throw std::runtime_error("API key file " + path + " holds no key");
  return keys;
}

AccessPolicy::AccessPolicy(AccessOptions opt) : opt_(std::move(opt)) {
  for (const auto& k : opt_.api_keys) {
    if (trim(k).empty()) throw std::invalid_argument("an API key must not be empty");
    digests_.push_back(sha256(trim(k)));
  }
  opt_.api_keys.clear();  // only the digests stay in memory
}

int AccessPolicy::key_index(std::string_view token) const {
  if (token.empty()) return -1;
  const Digest d = sha256(token);
  int index = -1;
  for (size_t i = 0; i < digests_.size(); ++i)  // every key compared: no early exit
    if (CRYPTO_memcmp(d.data(), digests_[i].data(), d.size()) == 0) index = static_cast<int>(i);
  return index;
}

namespace {
std::string_view bearer_token(const std::string& authorization) {
  if (!iequals_prefix(authorization, "Bearer ")) return {};
  return trim(std::string_view(authorization).substr(7));
}
}  // namespace

int AccessPolicy::matched_key(const httplib::Request& req) const {
  const std::string auth = req.get_header_value("Authorization");
  return key_index(bearer_token(auth));
}

bool AccessPolicy::origin_allowed(const std::string& origin) const {
  for (const auto& o : opt_.cors_origins)
    if (o == "*" || o == origin) return true;
  return false;
}

bool host_allowed(std::string_view host, const std::vector<std::string>& allowed) {
  host = trim(host);
  std::string name;
  if (!host.empty() && host.front() == '[') {  // [v6]:port
    const size_t close = host.find(']');
    if (close == std::string_view::npos) return false;
    const std::string v6(host.substr(1, close - 1));
    in6_addr a6{};
    if (inet_pton(AF_INET6, v6.c_str(), &a6) == 1) return true;
    name = std::string(host.substr(0, close + 1));
  } else {
    name = std::string(host.substr(0, host.find(':')));
    in_addr a4{};
    if (inet_pton(AF_INET, name.c_str(), &a4) == 1) return true;
  }
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  if (!name.empty() && name.back() == '.') name.pop_back();  // "localhost." is localhost
  if (name == "localhost" || (name.size() > 10 && name.compare(name.size() - 10, 10, ".localhost") == 0)) return true;
  for (const auto& a : allowed) {
    std::string want = a;
    std::transform(want.begin(), want.end(), want.begin(), [](unsigned char c) { return std::tolower(c); });
    if (want == "*" || want == name) return true;
  }
  return false;
}

bool AccessPolicy::pre_route(const httplib::Request& req, httplib::Response& res, bool needs_key) {
  // Without keys nothing else stands between a rebinding page and the API (issue 29, item 3).
  if (digests_.empty() && req.has_header("Host") && !host_allowed(req.get_header_value("Host"), opt_.allowed_hosts)) {
    if (request_has_body(req)) GuardedServer::close_after_response();
    nlohmann::json body = api::error_body(
        403, "permission_error",
        "Host '" + req.get_header_value("Host").substr(0, 200) +
            "' is not allowed: without API keys the server answers only to IP addresses and localhost "
            "(a guard against DNS rebinding). Start it with --allowed-host NAME, or with --api-key.");
    body["error"]["code"] = "host_not_allowed";
    res.status = 403;
    res.set_content(api::dump(body), "application/json");
    return true;
  }
  if (!needs_key) return false;
  const std::string origin = req.get_header_value("Origin");
  const bool cors = !origin.empty() && origin_allowed(origin);
  if (cors) {
    res.set_header("Access-Control-Allow-Origin", origin);
    res.set_header("Vary", "Origin");
    if (req.method == "OPTIONS") {
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
      res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type");
      res.set_header("Access-Control-Max-Age", "600");
      return true;
    }
  }
  if (digests_.empty()) return false;
  if (req.method == "GET" && req.path == "/health") return false;
  if (req.method == "GET" && req.path == "/metrics" && opt_.metrics_public) return false;

  const std::string auth = req.get_header_value("Authorization");
  const std::string_view token = bearer_token(auth);
  if (key_index(token) >= 0) return false;

  ++unauthorized_;
  if (request_has_body(req)) GuardedServer::close_after_response();  // its body stays unread
  const char* msg = token.empty()
                        ? "You didn't provide an API key. Send it as 'Authorization: Bearer <key>'."
                        : "Incorrect API key provided.";
  nlohmann::json body = api::error_body(401, kInvalidRequestError, msg);
  body["error"]["code"] = "invalid_api_key";
  res.status = 401;
  res.set_header("WWW-Authenticate", "Bearer");
  res.set_content(api::dump(body), "application/json");
  return true;
}

void require_json_content(const httplib::Request& req) {
  const std::string ct = req.get_header_value("Content-Type");
  const std::string_view type = trim(std::string_view(ct).substr(0, ct.find(';')));
  if (iequals_prefix(type, "application/json") && type.size() == 16) return;
  GuardedServer::close_after_response();
  throw invalid_request("Content-Type must be application/json" + (ct.empty() ? std::string() : ", got '" + ct + "'"), "", 415);
}

}  // namespace cf
