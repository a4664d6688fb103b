messages = [{"role": "user", "content": (
    "Solve the following math word problem. Reason step by step, then give the final answer as a plain number on the last line, in the form '#### <number>'.\n"
    '\n'
    'Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?'
)}]
max_new_tokens = 512  # the length the head was trained and evaluated at
