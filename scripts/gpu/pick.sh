# Sourced by the GPU build scripts. `cargo ... --message-format=json | pick NAME` prints the
# executable cargo built for target NAME (the last one reported), jq-free.
pick() {
    python3 -c 'import json,sys
for l in sys.stdin:
    try: m=json.loads(l)
    except ValueError: continue
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]==sys.argv[1]: print(m["executable"])' "$1" | tail -n1
}
