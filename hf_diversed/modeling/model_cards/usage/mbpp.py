messages = [{"role": "user", "content": (
    'You are an expert Python programmer, and here is your task: Write a python function to find the first repeated character in a given string.\n'
    'Your code should pass this test:\n'
    '\n'
    'assert first_repeated_char("abcabc") == "a"\n'
    '\n'
    'Reply with the complete Python function (and any imports it needs) in a single ```python code block.'
)}]
max_new_tokens = 512  # the length the head was trained and evaluated at
