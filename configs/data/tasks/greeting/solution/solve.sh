cat > greet.py <<'PY'
def greet(name):
    return f"Hello, {name}!"
PY
git commit -qam "implement greet"
