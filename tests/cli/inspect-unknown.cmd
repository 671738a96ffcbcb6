printf 'just some text\n' > notes.txt && $ASYNCPP inspect notes.txt
