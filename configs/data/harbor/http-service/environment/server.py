import http.server

class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"pong" if self.path == "/ping" else b"?"
        self.send_response(200 if self.path == "/ping" else 404)
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass

http.server.HTTPServer(("127.0.0.1", 8080), Handler).serve_forever()
