/* sites.c: placeholder, filled in by the call-sites work. */
int main(void) { return 0; }
