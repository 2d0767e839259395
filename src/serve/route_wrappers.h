// The wrappers every HTTP route of `chunkfuse serve` goes through (moved out of server.cpp so
// that route files beside it, e.g. knowledge_routes.cpp, share them): OpenAI-style error
// bodies for whatever a handler throws, the connection guard's phase marks, JSON-only POST
// bodies read in pieces and refused past --max-body.
#pragma once
#include <httplib.h>

#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "serve/request.h"

namespace cf {

using RouteFn = std::function<void(const httplib::Request&, httplib::Response&)>;
using PostRouteFn = std::function<void(const httplib::Request&, httplib::Response&, const std::string& body)>;

void reply_json(httplib::Response& res, int status, const nlohmann::json& body);
void reply_error(httplib::Response& res, const RequestError& e);

// Runs h; RequestError becomes its status and body, any other exception a 500.
void run_guarded(const std::function<void()>& h, httplib::Response& res);

// A route without a body (GET): the request is fully read when it is dispatched.
httplib::Server::Handler guarded(RouteFn h);
// A POST or DELETE route that takes no body. Registered as a content-reader route so that
// httplib does not buffer one anyway (it would, without bound, for any other route).
httplib::Server::HandlerWithContentReader guarded_no_body(RouteFn h);
// A POST route: JSON only, body read in pieces and refused past max_body_bytes whatever its
// transfer encoding (httplib's own limit sees Content-Length only).
httplib::Server::HandlerWithContentReader guarded_post(size_t max_body_bytes, PostRouteFn h);

}  // namespace cf
