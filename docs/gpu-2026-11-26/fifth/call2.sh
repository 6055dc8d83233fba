#!/usr/bin/env bash
# Call 2: wait for the curves, copying what there is every 10 s (a call cut short still returns it).
keep=$PWD/gpu-out/s5; t0=$SECONDS
while [ $((SECONDS - t0)) -lt 580 ] && ! grep -q "within seed noise" "$keep/curves.txt"; do
  sleep 10; cp -r "$keep" "$OUT/"
done
cp -r "$keep" "$OUT/"; cat "$keep/curves.txt" | tail -25
