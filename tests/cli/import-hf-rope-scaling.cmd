mkdir m && printf "{\"model_type\": \"llama\",\n \"rope_scaling\": {\"type\": \"dynamic\"}}\n" > m/config.json && $ASYNCPP import-hf m
