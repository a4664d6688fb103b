messages = [{"role": "user", "content": (
    'Complete the following Python function. Reply with the complete function, including its signature and any imports it needs, in a single ```python code block.\n'
    '\n'
    '```python\n'
    'from typing import List\n'
    '\n'
    '\n'
    'def has_close_elements(numbers: List[float], threshold: float) -> bool:\n'
    '    """ Check if in given list of numbers, are any two numbers closer to each other than\n'
    '    given threshold.\n'
    '    >>> has_close_elements([1.0, 2.0, 3.0], 0.5)\n'
    '    False\n'
    '    >>> has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)\n'
    '    True\n'
    '    """\n'
    '```'
)}]
max_new_tokens = 512  # the length MBPP heads are evaluated at
