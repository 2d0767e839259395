#include "serve/route_wrappers.h"

#include "serve/http_access.h"
#include "serve/http_guard.h"
#include "serve/request_limits.h"
#include "serve/api_json.h"

namespace cf {

void reply_json(httplib::Response& res, int status, const nlohmann::json& body) {
  res.status = status;
  res.set_content(api::dump(body), "application/json");
}

void reply_error(httplib::Response& res, const RequestError& e) { reply_json(res, e.status, api::error_body(e)); }

void run_guarded(const std::function<void()>& h, httplib::Response& res) {
  try {
    h();
  } catch (const RequestError& e) {
    reply_error(res, e);
  } catch (const std::exception& e) {
    reply_json(res, 500, api::error_body(500, "server_error", e.what()));
  }
}

httplib::Server::Handler guarded(RouteFn h) {
  return [h = std::move(h)](const httplib::Request& req, httplib::Response& res) {
    GuardedServer::request_read();
    run_guarded([&] { h(req, res); }, res);
  };
}

httplib::Server::HandlerWithContentReader guarded_no_body(RouteFn h) {
  return [h = std::move(h)](const httplib::Request& req, httplib::Response& res, const httplib::ContentReader&) {
    // Whatever the client sent stays unread, so the connection ends after the response.
    if (request_has_body(req)) GuardedServer::close_after_response();
    GuardedServer::request_read();
    run_guarded([&] { h(req, res); }, res);
  };
}

httplib::Server::HandlerWithContentReader guarded_post(size_t max_body_bytes, PostRouteFn h) {
  return [max_body_bytes, h = std::move(h)](const httplib::Request& req, httplib::Response& res,
                                            const httplib::ContentReader& reader) {
    run_guarded(
        [&] {
          require_json_content(req);
          const std::string body = read_body_bounded(req, reader, max_body_bytes);
          GuardedServer::request_read();
          h(req, res, body);
        },
        res);
  };
}

}  // namespace cf
