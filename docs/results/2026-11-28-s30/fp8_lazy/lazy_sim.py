# e4m3 P with the exact running max (P <= 1) against the lazy max (P <= 256): relative RMSE against float64 attention
import numpy as np, math, sys
rng=np.random.default_rng(0)
def e4m3(x):
    x=np.asarray(x,dtype=np.float64); a=np.abs(x)
    e=np.floor(np.log2(np.maximum(a,1e-300))); e=np.maximum(e,-6)
    step=2.0**(e-3)
    r=np.minimum(np.round(a/step)*step,448.0)
    return np.sign(x)*r
N,M=4096,256
for D in (64,128,256):
 for fam in ("normal","outliers"):
  q=rng.standard_normal((M,D)); k=rng.standard_normal((N,D)); v=rng.standard_normal((N,D))
  if fam=="outliers":
    for t in (q,k,v):
      mask=rng.random(t.shape)<0.001; t[mask]=rng.standard_normal(mask.sum())*10
  scale=1/math.sqrt(D)
  s_ref=q@k.T*scale; p_ref=np.exp(s_ref-s_ref.max(1,keepdims=True)); ref=(p_ref/p_ref.sum(1,keepdims=True))@v
  def qz(t):
    s=np.abs(t).max()/448; return e4m3(t/s), s
  qq,qs=qz(q); kk,ks=qz(k); vq,vsc=qz(v)
  S=(qq@kk.T)*qs*ks*scale*math.log2(math.e)
  BN=128
  out={}
  for mode in ("exact","lazy"):
    m=np.full(M,-np.inf); l=np.zeros(M); o=np.zeros((M,D))
    for j in range(N//BN-1,-1,-1):
      s=S[:,j*BN:(j+1)*BN]
      mn=np.maximum(m,s.max(1))
      if mode=="lazy":
        keep=~((mn-m)>8); mn=np.where(keep,m,mn)
      with np.errstate(invalid='ignore'): r=np.nan_to_num(np.exp2(m-mn))
      p=np.exp2(s-mn[:,None])
      l=l*r+p.sum(1)
      o=o*r[:,None]+e4m3(p)@vq[j*BN:(j+1)*BN]
      m=mn
    res=o/l[:,None]*vsc
    out[mode]=np.sqrt(((res-ref)**2).mean())/np.sqrt((ref**2).mean())
  print(D, fam, {k:round(v,5) for k,v in out.items()}, flush=True)
