"""Container healthcheck: exit 0 when the URL answers as expected.

Without an argument: scrapyd's daemonstatus.json, with the node's basic auth,
must say {"status": "ok"}. With a URL: any 2xx answer.
"""

import base64
import json
import os
import sys
import urllib.request


def main() -> int:
    port = os.environ.get("SCRAPYD_HTTP_PORT", "6800")
    url = sys.argv[1] if len(sys.argv) > 1 else f"http://127.0.0.1:{port}/daemonstatus.json"
    request = urllib.request.Request(url)
    user, password = os.environ.get("SCRAPYD_USERNAME"), os.environ.get("SCRAPYD_PASSWORD")
    if len(sys.argv) == 1 and user and password:
        token = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", "Basic " + token)
    try:
        with urllib.request.urlopen(request, timeout=4) as response:
            body = response.read()
    except OSError as exc:
        sys.stderr.write(f"{url}: {exc}\n")
        return 1
    if len(sys.argv) == 1 and json.loads(body).get("status") != "ok":
        sys.stderr.write(f"{url}: {body[:200]!r}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
