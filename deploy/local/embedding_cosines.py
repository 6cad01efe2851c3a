"""`make demo`: cosine similarity of embed-batcher's vectors for pairs of
articles, from the output topic's records as `streamctl consume` prints them
(JSON lines; standard library only).

    python3 deploy/local/embedding_cosines.py ROWS.jsonl LABEL TENANT/DOC TENANT/DOC [LABEL A B ...]

The vectors are L2-normalised, so the cosine is their dot product; it is
computed in full anyway.
"""

import json
import math
import sys


def main():
    path, pairs = sys.argv[1], sys.argv[2:]
    if not pairs or len(pairs) % 3:
        sys.exit(__doc__)
    rows = {}
    with open(path) as lines:
        for line in lines:
            value = json.loads(line)["value"]
            # The last row of a document wins, as for a consumer of the topic.
            rows[f"{value['tenant_id']}/{value['doc_id']}"] = value
    for label, a, b in zip(pairs[0::3], pairs[1::3], pairs[2::3]):
        missing = [doc for doc in (a, b) if doc not in rows]
        if missing:
            sys.exit(f"no row for {', '.join(missing)} in {path}")
        x, y = rows[a]["embedding"], rows[b]["embedding"]
        dot = sum(p * q for p, q in zip(x, y))
        cosine = dot / (math.sqrt(sum(p * p for p in x)) * math.sqrt(sum(q * q for q in y)))
        print(
            f"   {label:<12} {a} {rows[a]['title']!r} vs {b} {rows[b]['title']!r}: "
            f"cosine {cosine:.3f} ({len(x)} numbers each)"
        )


if __name__ == "__main__":
    main()
