"""The two names ``sglang/utils.py`` imports (notebook helpers; a server never calls them)."""


class HTML:
    def __init__(self, data=None, *args, **kwargs):
        self.data = data

    def __repr__(self):
        return f"HTML({self.data!r})"


def display(*objs, **kwargs):
    for o in objs:
        print(o)
